"""Which built models the bench measures: directories in the model cache, their manifests, and
the GGUF they were built from. Nothing here builds or writes a model: a missing build is
reported by the caller (`make model` builds them)."""

from __future__ import annotations

import json
from pathlib import Path

from app.models.registry import cache_root, default_model_dir as registry_default_dir

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
# The default build may be in the middle of a rebuild as another variant: this one is then used.
FALLBACK_VARIANT = "ctx2048-8da4w-sdpa"
LONG_CONTEXT = 32768


def models_root() -> Path:
    return cache_root() / "models"


def is_built(directory: Path | None) -> bool:
    """A complete build: the manifest is written last, after model.pte."""
    return directory is not None and (directory / "model.pte").is_file() and (directory / "etserve.json").is_file()


def default_model_dir() -> Path:
    """The default served model's directory, or the fallback variant while it is not built."""
    directory = registry_default_dir(DEFAULT_MODEL)
    fallback = models_root() / DEFAULT_MODEL / FALLBACK_VARIANT
    return directory if is_built(directory) or not is_built(fallback) else fallback


def long_context_dir(directory: Path) -> Path | None:
    """A build of the same model and layout holding LONG_CONTEXT tokens: `directory` itself if it
    does, else its ctx32768 sibling (e.g. ctx32768-8da4w-e4-sdpa, or any ctx32768-* variant with the
    same quantization), or None while none is built."""
    if is_built(directory) and max_seq_len(directory) >= LONG_CONTEXT:
        return directory
    layout = directory.name.split("-", 1)[1] if "-" in directory.name else ""
    exact = directory.with_name(f"ctx{LONG_CONTEXT}-{layout}")
    if is_built(exact):
        return exact
    for candidate in sorted(directory.parent.glob(f"ctx{LONG_CONTEXT}-*")):
        if is_built(candidate) and layout.split("-")[0] in candidate.name:
            return candidate
    return None


def built_models() -> list[Path]:
    return sorted(p.parent for p in models_root().glob("*/*/etserve.json") if is_built(p.parent))


def model_json(directory: Path, name: str) -> dict:
    return json.loads((directory / name).read_text())


def max_seq_len(directory: Path) -> int:
    return model_json(directory, "etserve.json")["max_seq_len"]


def label(directory: Path) -> str:
    return f"{directory.parent.name}/{directory.name}"


def plain_of(directory: Path) -> Path:
    """The same build without the custom ops; else, if that is not built, also with an fp32
    embedding table (which does not change how decode speed depends on the fill)."""
    plain = directory.with_name(directory.name.removesuffix("-sdpa"))
    fp32_table = plain.with_name(plain.name.replace("-e4", ""))
    return plain if is_built(plain) or not is_built(fp32_table) else fp32_table


def source_gguf(name: str = DEFAULT_MODEL) -> Path:
    """The GGUF `name` is built from (the Qwen one is joined from its package parts, once, into
    the model cache): the peer's comparable model is made from the same file."""
    from app.models.gguf_source import locate_gguf
    from app.models.registry import get_spec

    return locate_gguf(get_spec(name))


def kv_bytes_per_position(directory: Path) -> int:
    """The K and V caches of every layer for one position: fp32, or (an int8 build's
    ExecuTorch quantized cache) int8 values with an fp32 scale and an int8 zero point per kv
    head."""
    params = model_json(directory, "params.json")
    manifest = model_json(directory, "etserve.json")
    int8 = manifest.get("kv_cache", "int8" if "-kv8" in directory.name else "fp32") == "int8"
    per_head = params["head_dim"] + 4 + 1 if int8 else params["head_dim"] * 4
    return params["n_layers"] * 2 * params["n_kv_heads"] * per_head


def bytes_per_token(directory: Path, fill: int) -> float:
    """Bytes a decode step must read from memory at context `fill`, estimated from the build:
    every weight once, except the embedding table, of which one row is read per token (the
    table is the largest tensor in these small models; a tied output projection is stored as
    its own copy in the .pte, so it stays counted), plus the K and V caches up to `fill`
    (every layer; the custom-op kernels read the filled part only). Activations are small and
    stay in cache. So: .pte size - embedding table + fill * KV bytes per position."""
    params = model_json(directory, "params.json")
    manifest = model_json(directory, "etserve.json")
    vocab, dim = params["vocab_size"], params["dim"]
    if manifest.get("embedding_quantize", "4bit" if "-e4" in directory.name else "none") == "4bit":
        table = vocab * dim / 2 + vocab * dim / 32 * 4  # int4 values + an fp32 scale per group of 32
    else:
        table = vocab * dim * 4
    return (directory / "model.pte").stat().st_size - table + fill * kv_bytes_per_position(directory)
