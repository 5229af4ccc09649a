"""Phi-3 / Phi-3.5 / Phi-4-mini (GGUF ``general.architecture`` "phi3") on ExecuTorch's llama model.

What the GGUF says and where it goes:

- ``attn_qkv`` [(heads + 2 kv_heads) * head_dim, dim]: q, k and v in one tensor, split by rows into
  ``wq`` / ``wk`` / ``wv`` (``FUSED``: q has ``dim`` rows, as head_dim = embedding_length / head_count,
  k and v half the rest each); ``ffn_up`` [2 * feed_forward_length, dim]: the gate (first half,
  SiLU'd: ``w1``) and the up projection (second half: ``w3``), as llama.cpp's fused SwiGLU and
  transformers' ``Phi3MLP`` read it. The checkpoint (app/models/checkpoint.py) takes each part's
  rows from the GGUF tensor. No biases.
- ``rope.dimension_count``: the rotary dims of a head (Phi-4-mini: 96 of 128); fewer than head_dim
  is ExecuTorch's ``partial_rotary_factor`` (its HF rope rotates the first dims, passes the rest).
- Rope: half-split (HF) layout, as llama.cpp's NEOX rope type keeps it (``use_hf_rope``).
- LongRoPE (the 128k models, Phi-3.5, Phi-4-mini; ``longrope_params``): ``rope_factors_short`` /
  ``rope_factors_long`` tensors, ``rope.scaling.original_context_length`` and ``rope.scaling.attn_factor`` go to
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

LAYER_NAMES: dict[str, str] = {}  # the fused tensors are FUSED's; the others have llama's names


def _qkv(shape: tuple[int, ...]) -> list[tuple[str, int, int]]:
    rows, dim = shape
    kv = (rows - dim) // 2
    if rows <= dim or (rows - dim) % 2:
        raise ValueError(f"phi3: attn_qkv of shape {shape} is not q ({dim} rows) plus equal k and v")
    return [("attention.wq.weight", 0, dim), ("attention.wk.weight", dim, dim + kv),
            ("attention.wv.weight", dim + kv, rows)]


def _gate_up(shape: tuple[int, ...]) -> list[tuple[str, int, int]]:
    rows = shape[0]
    if rows % 2:
        raise ValueError(f"phi3: ffn_up of shape {shape} is not gate and up halves")
    return [("feed_forward.w1.weight", 0, rows // 2), ("feed_forward.w3.weight", rows // 2, rows)]


# GGUF layer tensor -> its parts: (ExecuTorch layer name, first row, end row) from its (out, in) shape
FUSED = {"attn_qkv.weight": _qkv, "ffn_up.weight": _gate_up}


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


def longrope_params(md: dict[str, Any], rope: dict[str, Any], params: dict[str, Any]) -> None:
    """LongRoPE's fields of ``params.json`` from the file's ``rope_factors_*`` (``rope``: by GGUF name)."""
    from . import UnsupportedGGUF

    short, long = rope.get("rope_factors_short.weight"), rope.get("rope_factors_long.weight")
    original = arch_value(md, "rope.scaling.original_context_length")
    if short is None or long is None or original is None:
        raise UnsupportedGGUF("phi3: LongRoPE needs rope_factors_short, rope_factors_long and "
                              "rope.scaling.original_context_length")
    params.update({
        "rope_scaling_short_factor": [float(x) for x in short.tolist()],
        "rope_scaling_long_factor": [float(x) for x in long.tolist()],
        "original_max_position_embeddings": int(original),
        "max_position_embeddings": int(arch_value(md, "context_length")),
    })
    attn_factor = arch_value(md, "rope.scaling.attn_factor")
    if attn_factor is not None:
        params["rope_scaling_attention_factor"] = float(attn_factor)


def fold(sd: dict, params: dict[str, Any]) -> None:
    """No weights change (the fused tensors were split into the checkpoint's names as it was read)."""


@contextlib.contextmanager
def transforming() -> Iterator[None]:
    """No source transformation: the split checkpoint is a plain llama model."""
    yield
