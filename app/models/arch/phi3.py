"""Phi-3 / Phi-3.5 / Phi-4-mini (GGUF ``general.architecture`` "phi3") on ExecuTorch's llama model.

What the GGUF says and where it goes:

- ``attn_qkv`` [(heads + 2 kv_heads) * head_dim, dim]: q, k and v in one tensor, split by rows into
  ``wq`` / ``wk`` / ``wv``; ``ffn_up`` [2 * feed_forward_length, dim]: the gate (first half, SiLU'd:
  ``w1``) and the up projection (second half: ``w3``) in one tensor, as llama.cpp's fused SwiGLU
  and transformers' ``Phi3MLP`` read it. No biases; head_dim = embedding_length / head_count.
- ``rope.dimension_count``: the rotary dims of a head (Phi-4-mini: 96 of 128); fewer than head_dim
  is ExecuTorch's ``partial_rotary_factor`` (its HF rope rotates the first dims, passes the rest).
- Rope: half-split (HF) layout, as llama.cpp's NEOX rope type keeps it (``use_hf_rope``).
- LongRoPE (the 128k models, Phi-3.5, Phi-4-mini): ``rope_factors_short`` / ``rope_factors_long``
  tensors, ``rope.scaling.original_context_length`` and ``rope.scaling.attn_factor`` go to
  ExecuTorch's ``rope_scaling_short_factor`` / ``long_factor`` / ``original_max_position_embeddings``
  / ``rope_scaling_attention_factor``; ``context_length`` to ``max_position_embeddings``. Like
  llama.cpp, a build whose context exceeds the original one uses the long factors at every position,
  otherwise the short ones.
- ``attention.sliding_window`` (Phi-3-mini-4k: 2047) is not applied, as in llama.cpp (which turned
  Phi's sliding window off): every layer attends to the whole context.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ..gguf_meta import arch_value

LAYER_NAMES = {
    "attn_qkv.weight": "attention.wqkv.weight",  # split by fold()
    "ffn_up.weight": "feed_forward.w13.weight",  # split by fold()
}
GLOBAL_NAMES = {  # not weights: LongRoPE's factors, into params by fold()
    "rope_factors_short.weight": "rope_factors_short",
    "rope_factors_long.weight": "rope_factors_long",
}


def check(md: dict[str, Any]) -> None:
    """Refuse phi3 files this module does not map (one line each; ``md``: the header's scalars)."""
    from . import UnsupportedGGUF

    scaling = arch_value(md, "rope.scaling.type")
    if scaling not in (None, "none", "longrope", "su") and float(arch_value(md, "rope.scaling.factor", 1.0)) != 1.0:
        raise UnsupportedGGUF(f"phi3 with rope scaling {scaling!r} is not supported")
    kl = arch_value(md, "attention.key_length")
    dim, heads = arch_value(md, "embedding_length"), arch_value(md, "attention.head_count")
    if kl is not None and dim and heads and int(kl) != int(dim) // int(heads):
        raise UnsupportedGGUF(f"phi3 with key_length {kl} != embedding_length / head_count")


def update_params(md: dict[str, Any], params: dict[str, Any]) -> None:
    """Phi-3's fields of ``params.json`` (ExecuTorch ``ModelArgs``), in place."""
    head_dim = params["dim"] // params["n_heads"]
    rope_dims = int(arch_value(md, "rope.dimension_count", head_dim))
    params.update({"head_dim": head_dim, "use_hf_rope": True, "partial_rotary_factor": rope_dims / head_dim})
    # LongRoPE's scalars; fold() drops them again when the file has no factor tensors
    original = arch_value(md, "rope.scaling.original_context_length")
    if original is not None:
        params["original_max_position_embeddings"] = int(original)
        params["max_position_embeddings"] = int(arch_value(md, "context_length"))
    attn_factor = arch_value(md, "rope.scaling.attn_factor")
    if attn_factor is not None:
        params["rope_scaling_attention_factor"] = float(attn_factor)


def fold(sd: dict, params: dict[str, Any]) -> None:
    """Split the fused tensors into ExecuTorch's names; LongRoPE's factors into ``params``."""
    from . import UnsupportedGGUF

    hd, nq, nkv, hidden = params["head_dim"], params["n_heads"], params["n_kv_heads"], params["hidden_dim"]
    for i in range(params["n_layers"]):
        p = f"layers.{i}."
        qkv = sd.pop(p + "attention.wqkv.weight")
        if qkv.shape[0] != (nq + 2 * nkv) * hd:
            raise ValueError(f"phi3: blk.{i}.attn_qkv has {qkv.shape[0]} rows, expected {(nq + 2 * nkv) * hd}")
        sd[p + "attention.wq.weight"], sd[p + "attention.wk.weight"], sd[p + "attention.wv.weight"] = (
            t.contiguous() for t in qkv.split([nq * hd, nkv * hd, nkv * hd]))
        w13 = sd.pop(p + "feed_forward.w13.weight")
        if w13.shape[0] != 2 * hidden:
            raise ValueError(f"phi3: blk.{i}.ffn_up has {w13.shape[0]} rows, expected 2 x {hidden}")
        sd[p + "feed_forward.w1.weight"], sd[p + "feed_forward.w3.weight"] = (t.contiguous() for t in w13.split(hidden))
    short, long = sd.pop("rope_factors_short", None), sd.pop("rope_factors_long", None)
    if short is None and long is None:
        for key in ("original_max_position_embeddings", "max_position_embeddings", "rope_scaling_attention_factor"):
            params.pop(key, None)
        return
    if short is None or long is None or "original_max_position_embeddings" not in params:
        raise UnsupportedGGUF("phi3: LongRoPE needs rope_factors_short, rope_factors_long and "
                              "rope.scaling.original_context_length")
    params["rope_scaling_short_factor"] = [float(x) for x in short.flatten().tolist()]
    params["rope_scaling_long_factor"] = [float(x) for x in long.flatten().tolist()]


@contextlib.contextmanager
def transforming() -> Iterator[None]:
    """No source transformation: the split checkpoint is a plain llama model."""
    yield
