"""Architecture families a GGUF can be built from, and the quick refusal of the others.

Each family maps the GGUF's own facts (``general.architecture`` and its ``<arch>.*`` keys) onto
ExecuTorch's llama model: ``llama`` and ``qwen2`` need nothing beyond app/models/checkpoint.py
(llama's Llama 3 rope scaling: llama3_rope.py); ``qwen3`` (qwen3.py) adds the q/k norms' tensor
names and params; ``phi3`` (phi3.py) splits its fused q/k/v and gate/up tensors and maps partial
rotary and LongRoPE; ``gemma3`` (gemma3.py) adds tensor names, params and a source transformation
of the model.

``check_gguf`` reads only the header and the tensor table (memory-mapped, no tensor data), so a
file we cannot build is refused by name in seconds, before any dequantizing or export.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Optional

# GGUF general.architecture -> the module of its family (None: checkpoint.py's plain llama path).
ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3", "gemma3")

# GGML tensor types the build dequantizes (gguf.quants). Others (IQ*, TQ*, Q2_K/Q3_K, ...) are refused.
TENSOR_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


class UnsupportedGGUF(ValueError):
    """A GGUF of an architecture or tensor type we do not build (the message is one line)."""


def family(architecture: str) -> Optional[ModuleType]:
    """The module of an architecture family with extras (qwen3, phi3, gemma3), None for plain llama/qwen2."""
    if architecture == "gemma3":
        from . import gemma3

        return gemma3
    if architecture == "qwen3":
        from . import qwen3

        return qwen3
    if architecture == "phi3":
        from . import phi3

        return phi3
    return None


def _type_name(type_id: int) -> str:
    import gguf

    try:
        return gguf.GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type {type_id}"


def check_gguf(path: Path) -> str:
    """The GGUF's architecture, or ``UnsupportedGGUF`` naming what we do not support
    (from the header only: app/models/gguf_header.py, milliseconds)."""
    from ..gguf_header import read_header

    header = read_header(Path(path))
    arch = header.metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedGGUF(f"{Path(path).name}: unsupported GGUF architecture {arch!r} "
                              f"(supported: {', '.join(ARCHITECTURES)})")
    bad: dict[str, list[str]] = {}
    for t in header.tensors:
        name = _type_name(t.type_id)
        if name not in TENSOR_TYPES:
            bad.setdefault(name, []).append(t.name)
    if bad:
        what = "; ".join(f"{k} ({len(v)} tensors, e.g. {v[0]})" for k, v in sorted(bad.items()))
        raise UnsupportedGGUF(f"{Path(path).name}: unsupported GGUF tensor type {what} "
                              f"(supported: {', '.join(TENSOR_TYPES)})")
    if arch == "llama":
        from . import llama3_rope

        llama3_rope.check(header.metadata)
    elif any(t.name == "rope_freqs.weight" for t in header.tensors):
        raise UnsupportedGGUF(f"{Path(path).name}: {arch} with rope_freqs.weight (rope scaling factors) "
                              "is not supported (only llama's, Llama 3 scaling)")
    fam = family(arch)
    if fam is not None:
        fam.check(header.metadata)
    return arch
