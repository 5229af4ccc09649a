"""GGUF -> dequantized fp32 state dict and ``params.json`` in ExecuTorch's llama naming (build time)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Optional

from .arch import family
from .gguf_meta import arch_value
from .registry import ModelSpec

# GGUF tensor name -> ExecuTorch llama_transformer name ("{}" is the layer index).
_GLOBAL_NAMES = {
    "token_embd.weight": "tok_embeddings.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "output.weight",
}
# Tensors that are rope parameters, not weights: read apart (``rope_tensors``) into params.json.
# rope_freqs: Llama 3's rope scaling (arch/llama3_rope.py); rope_factors_*: LongRoPE (arch/phi3.py).
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight")
_LAYER_NAMES = {
    "attn_norm.weight": "attention_norm.weight",
    "attn_q.weight": "attention.wq.weight",
    "attn_q.bias": "attention.wq.bias",
    "attn_k.weight": "attention.wk.weight",
    "attn_k.bias": "attention.wk.bias",
    "attn_v.weight": "attention.wv.weight",
    "attn_v.bias": "attention.wv.bias",
    "attn_output.weight": "attention.wo.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn_gate.weight": "feed_forward.w1.weight",
    "ffn_down.weight": "feed_forward.w2.weight",
    "ffn_up.weight": "feed_forward.w3.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


def executorch_name(gguf_name: str, extra: Optional[dict[str, str]] = None) -> str:
    """ExecuTorch llama parameter name for a GGUF tensor name (``extra``: the architecture
    family's own per-layer names, app/models/arch)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.match(gguf_name)
    if m:
        names = {**_LAYER_NAMES, **(extra or {})}
        if m.group(2) in names:
            return f"layers.{m.group(1)}.{names[m.group(2)]}"
    raise KeyError(f"unexpected GGUF tensor {gguf_name!r}")


def weight_parts(gguf_name: str, shape: tuple[int, ...], fam=None) -> list[tuple[str, int, int]]:
    """(ExecuTorch name, first row, end row) of each weight a GGUF tensor of PyTorch ``shape`` holds:
    one, all its rows, unless it is one of the family's ``FUSED`` tensors (phi3's attn_qkv, ffn_up),
    whose function gives each part's name and rows from the shape."""
    fused = getattr(fam, "FUSED", None)
    m = _LAYER_RE.match(gguf_name)
    if fused and m and m.group(2) in fused:
        return [(f"layers.{m.group(1)}.{name}", a, b) for name, a, b in fused[m.group(2)](shape)]
    return [(executorch_name(gguf_name, fam.LAYER_NAMES if fam is not None else None), 0, shape[0])]


def rope_tensors(reader) -> dict[str, Any]:
    """The file's ``ROPE_TENSORS`` by GGUF name, as fp32 torch vectors (a few hundred values)."""
    import numpy as np
    import torch
    from gguf.quants import dequantize

    return {t.name: torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1))
            for t in reader.tensors if t.name in ROPE_TENSORS}


def make_params(md: dict[str, Any], spec: ModelSpec, has_qkv_bias: bool,
                rope: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """``params.json`` content (ExecuTorch ``ModelArgs``) from GGUF metadata and the file's
    ``rope_tensors`` (``rope``: Llama 3's rope scaling, LongRoPE)."""
    arch = md["general.architecture"]
    if arch != spec.architecture:
        raise ValueError(f"GGUF architecture {arch!r}, expected {spec.architecture!r}")
    dim = int(arch_value(md, "embedding_length"))
    n_heads = int(arch_value(md, "attention.head_count"))
    vocab = arch_value(md, "vocab_size") or len(md["tokenizer.ggml.tokens"])
    params = {
        "dim": dim,
        "n_layers": int(arch_value(md, "block_count")),
        "n_heads": n_heads,
        "n_kv_heads": int(arch_value(md, "attention.head_count_kv", n_heads)),
        "head_dim": int(arch_value(md, "rope.dimension_count", dim // n_heads)),
        "vocab_size": int(vocab),
        "hidden_dim": int(arch_value(md, "feed_forward_length")),
        "norm_eps": float(arch_value(md, "attention.layer_norm_rms_epsilon")),
        "rope_theta": float(arch_value(md, "rope.freq_base", 10000.0)),
        "use_scaled_rope": False,
        "use_hf_rope": spec.use_hf_rope,
        "attention_qkv_bias": has_qkv_bias,
    }
    fam = family(arch)
    if fam is not None:
        fam.update_params(md, params)
    rope = rope or {}
    if "rope_freqs.weight" in rope:
        from .arch import UnsupportedGGUF, llama3_rope

        if params["use_hf_rope"]:  # ExecuTorch scales only its interleaved (llama) rope
            raise UnsupportedGGUF(f"{arch}: rope_freqs.weight (rope scaling) is supported for llama only")
        params.update(llama3_rope.scaling_params(md, rope["rope_freqs.weight"], params["head_dim"],
                                                 params["rope_theta"]))
    if any(name.startswith("rope_factors_") for name in rope):
        if not hasattr(fam, "longrope_params"):
            from .arch import UnsupportedGGUF

            raise UnsupportedGGUF(f"{arch}: LongRoPE factors are supported for phi3 only")
        fam.longrope_params(md, rope, params)
    return params


def dequantized_state_dict(reader, spec: ModelSpec) -> dict:
    """All GGUF tensors dequantized to fp32 torch tensors, in PyTorch (out, in) shape."""
    import numpy as np
    import torch
    from gguf.quants import dequantize

    fam = family(spec.architecture)
    sd = {}
    for t in reader.tensors:
        if t.name in ROPE_TENSORS:  # not weights: rope_tensors()
            continue
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        arr = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32, order="C").reshape(shape)  # own copy
        for name, a, b in weight_parts(t.name, shape, fam):
            sd[name] = torch.from_numpy(arr if (a, b) == (0, shape[0]) else arr[a:b].copy())
    if "output.weight" not in sd:
        if not spec.tied_output:
            raise ValueError(f"{spec.name}: GGUF has no output.weight but model is not tied")
        sd["output.weight"] = sd["tok_embeddings.weight"]
    elif spec.tied_output:
        raise ValueError(f"{spec.name}: GGUF has a separate output.weight but model is declared tied")
    return sd


def write_checkpoint(reader, md: dict[str, Any], spec: ModelSpec, work_dir: Path, *,
                     fold: Optional[Callable[[dict, dict], None]] = None) -> tuple[Path, Path, dict]:
    """Write ``checkpoint.pth`` and ``params.json`` into ``work_dir``; returns their paths and params.

    ``fold(state_dict, params)``, if given, changes the fp32 weights in place before they are saved
    (int8 KV caches: the key smoothing of kv_smoothing.py).

    ``work_dir`` must not contain "int8" or "8da4w": the exporter switches to pre-quantized loading
    when the checkpoint path contains those substrings.
    """
    import torch

    if "int8" in str(work_dir) or "8da4w" in str(work_dir):
        raise ValueError(f"checkpoint dir {work_dir} must not contain 'int8' or '8da4w'")
    sd = dequantized_state_dict(reader, spec)
    params = make_params(md, spec, has_qkv_bias="layers.0.attention.wq.bias" in sd, rope=rope_tensors(reader))
    fam = family(spec.architecture)
    if fam is not None:
        fam.fold(sd, params)
    if fold is not None:
        fold(sd, params)
    ckpt = work_dir / "checkpoint.pth"
    params_path = work_dir / "params.json"
    # Untie (clone) so torch.save stores two tensors the model loads independently.
    if sd["output.weight"] is sd["tok_embeddings.weight"]:
        sd["output.weight"] = sd["output.weight"].clone()
    torch.save(sd, ckpt)
    params_path.write_text(json.dumps(params, indent=2))
    return ckpt, params_path, params
