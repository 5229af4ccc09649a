"""Qwen 3 (GGUF ``general.architecture`` "qwen3") on ExecuTorch's llama model.

Qwen 2 without the q/k/v biases, plus a per-head RMSNorm of q and k before rope:

- ``attn_q_norm`` / ``attn_k_norm`` [head_dim]: ExecuTorch's ``use_qk_norm`` with
  ``qk_norm_before_rope`` (the checkpoint names of ExecuTorch's own Qwen 3 example,
  examples/models/qwen3/convert_weights.py), eps ``attention.layer_norm_rms_epsilon``.
- ``attention.key_length`` / ``value_length``: ``head_dim``, which differs from
  ``embedding_length / head_count`` in most sizes (0.6B: 1024 / 16 = 64, head_dim 128).
  Attention scale 1/sqrt(head_dim), the custom SDPA op's default.
- Rope: half-split (HF) layout, as llama.cpp's NEOX rope type keeps it (``use_hf_rope``, set for
  every architecture but llama by gguf_file.py), base ``rope.freq_base``.

Nothing else changes: the model is ExecuTorch's ``TransformerBlock`` as it is (no source transform).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ..gguf_meta import arch_value

LAYER_NAMES = {
    "attn_q_norm.weight": "attention.q_norm_fn.weight",
    "attn_k_norm.weight": "attention.k_norm_fn.weight",
}


def check(md: dict[str, Any]) -> None:
    """Refuse qwen3 files this module does not map (one line each; ``md``: the header's scalars)."""
    from . import UnsupportedGGUF

    kl, vl = arch_value(md, "attention.key_length"), arch_value(md, "attention.value_length")
    if kl is not None and vl is not None and kl != vl:
        raise UnsupportedGGUF(f"qwen3: key_length {kl} != value_length {vl}")
    scaling = arch_value(md, "rope.scaling.type")
    if scaling not in (None, "none") and float(arch_value(md, "rope.scaling.factor", 1.0)) != 1.0:
        raise UnsupportedGGUF(f"qwen3 with rope scaling {scaling!r} x{arch_value(md, 'rope.scaling.factor')} "
                              "is not supported yet")


def update_params(md: dict[str, Any], params: dict[str, Any]) -> None:
    """Qwen 3's fields of ``params.json`` (ExecuTorch ``ModelArgs``), in place."""
    head_dim = arch_value(md, "attention.key_length")
    if head_dim is not None:
        params["head_dim"] = int(head_dim)
    params.update({
        "use_hf_rope": True,
        "use_qk_norm": True,
        "qk_norm_before_rope": True,
    })


def fold(sd: dict, params: dict[str, Any]) -> None:
    """No weights change; every layer must have its q/k norms (the exporter loads the checkpoint
    non-strictly: a missing norm would stay at its initial ones, silently)."""
    for i in range(params["n_layers"]):
        for name in ("q_norm_fn", "k_norm_fn"):
            key = f"layers.{i}.attention.{name}.weight"
            if key not in sd:
                raise ValueError(f"qwen3: no {key} (GGUF blk.{i}.attn_{name[0]}_norm.weight)")


@contextlib.contextmanager
def transforming() -> Iterator[None]:
    """No source transformation: ExecuTorch's llama model with ``use_qk_norm`` is Qwen 3."""
    yield
