"""Llama 3.1 / 3.2 rope scaling from a llama GGUF (``rope_freqs.weight``).

llama.cpp's converter does not write Llama 3's ``rope_scaling`` (rope_type "llama3": factor 8 for
3.1, 32 for 3.2, low/high frequency factors 1 and 4, original context 8192) into the metadata; it
writes the result, a ``rope_freqs.weight`` tensor of head_dim / 2 divisors, one per rotary frequency
(1 for the high frequencies, ``factor`` for the low ones, a smooth blend between). ExecuTorch
computes the same scaling itself (``use_scaled_rope``: rope.py ``apply_scaling`` with
``rope_scale_factor`` and ``high_freq_factor``; low frequency factor 1 and original context 8192
fixed), so the build derives those two from the file (``rope.scaling.factor`` when the metadata has
it, else the largest divisor) and checks that ExecuTorch's frequencies are the file's, refusing with
one line naming the first dimension that differs otherwise.
"""

from __future__ import annotations

from typing import Any

from ..gguf_meta import arch_value

HIGH_FREQ_FACTOR = 4  # Llama 3.1 / 3.2 / 3.3
LOW_FREQ_FACTOR = 1  # ExecuTorch's apply_scaling: fixed
ORIGINAL_CONTEXT = 8192  # ExecuTorch's apply_scaling: fixed
RTOL = 1e-4  # the file's divisors are float32; a wrong factor is off by a factor of 2 or more


def check(md: dict[str, Any]) -> None:
    """Refuse (from the header) llama rope scalings ExecuTorch does not compute."""
    from . import UnsupportedGGUF

    scaling = arch_value(md, "rope.scaling.type")
    factor = float(arch_value(md, "rope.scaling.factor", 1.0) or 1.0)
    if scaling not in (None, "none", "llama3") and factor != 1.0:
        raise UnsupportedGGUF(f"llama with rope scaling {scaling!r} x{factor:g} is not supported "
                              "(only Llama 3's, from rope_freqs.weight)")
    original = arch_value(md, "rope.scaling.original_context_length")
    if original is not None and int(original) != ORIGINAL_CONTEXT and factor != 1.0:
        raise UnsupportedGGUF(f"llama rope scaling from an original context of {original} "
                              f"(ExecuTorch's Llama 3 scaling assumes {ORIGINAL_CONTEXT})")


def scaling_params(md: dict[str, Any], rope_freqs, head_dim: int, theta: float) -> dict[str, Any]:
    """``params.json`` fields for the file's ``rope_freqs`` (a float tensor of head_dim / 2)."""
    import torch
    from executorch.examples.models.llama.rope import apply_scaling

    from . import UnsupportedGGUF

    divisors = rope_freqs.detach().to(torch.float64).flatten()
    if divisors.numel() != head_dim // 2:
        raise UnsupportedGGUF(f"llama: rope_freqs.weight has {divisors.numel()} values for head_dim {head_dim} "
                              f"(expected {head_dim // 2})")
    if bool(torch.all(divisors == 1.0)):
        return {"use_scaled_rope": False}
    factor = float(arch_value(md, "rope.scaling.factor", 0.0) or divisors.max().item())
    if factor == int(factor):
        factor = int(factor)
    base = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    ours = apply_scaling(base, factor, HIGH_FREQ_FACTOR).to(torch.float64)
    file = base.to(torch.float64) / divisors
    rel = ((ours - file).abs() / file.abs()).tolist()
    bad = [i for i, r in enumerate(rel) if r > RTOL]
    if bad:
        i = bad[0]
        raise UnsupportedGGUF(
            f"llama: rope_freqs.weight is not Llama 3 rope scaling with factor {factor:g}, high/low frequency "
            f"factors {HIGH_FREQ_FACTOR}/{LOW_FREQ_FACTOR}, original context {ORIGINAL_CONTEXT}: dimension {i} "
            f"divisor {divisors[i].item():.6g}, ExecuTorch's {(base[i].item() / ours[i].item()):.6g} "
            f"({len(bad)} of {len(rel)} differ)")
    return {"use_scaled_rope": True, "rope_scale_factor": factor, "high_freq_factor": HIGH_FREQ_FACTOR}
