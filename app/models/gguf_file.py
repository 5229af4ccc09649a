"""A model straight from a GGUF file: ``python -m app.models build-gguf FILE`` and
``etserve --model FILE.gguf`` (build time; needs the ``gguf`` package).

Everything comes from the file: the architecture (refused by name, from the header, before any
heavy work: app/models/arch), hyperparameters, tokenizer, template and special tokens. The build
lands in ``<cache>/models/gguf/<sha256 of the file, 16 hex>/<variant>``, so the same file is built
once whatever its name or place; the model is served under its own ``general.name``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from .registry import DEFAULT_MAX_SEQ_LEN, MODELS, BuildOptions, ModelSpec, cache_root

# end-of-turn tokens of the common templates: generation stops at any the vocabulary holds
# (Llama 3.x instruct: eos <|eot_id|>, and its generation config stops at <|end_of_text|> and
# <|eom_id|> too)
END_OF_TURN = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<|end_of_text|>",
               "<|eom_id|>")
# up to this many parameters an fp32 build (faithful, 4 bytes a weight); beyond, 8da4w
FP32_MAX_PARAMS = 1_000_000_000


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "model"


def file_spec(path: Path, reader=None) -> ModelSpec:
    """The ``ModelSpec`` of a GGUF file (refuses an unsupported one first, in seconds)."""
    from .arch import check_gguf
    from .gguf_meta import arch_value, open_gguf

    path = Path(path).expanduser().resolve()
    arch = check_gguf(path)  # before anything slow
    reader = reader if reader is not None else open_gguf(path)
    md = {k: f.contents() for k, f in reader.fields.items()
          if not k.startswith("GGUF.") and k not in ("tokenizer.ggml.merges", "tokenizer.ggml.scores")}
    tokens: list[str] = md.get("tokenizer.ggml.tokens") or []
    types: list[int] = md.get("tokenizer.ggml.token_type") or []
    eos = md.get("tokenizer.ggml.eos_token_id")
    if eos is None or not tokens:
        raise ValueError(f"{path.name}: no tokenizer or eos token in the GGUF")
    eos_ids = [int(eos)] + [i for i, t in enumerate(tokens)
                            if t in END_OF_TURN and i != int(eos) and (not types or types[i] == 3)]
    bos = md.get("tokenizer.ggml.bos_token_id", eos)
    names = {t.name for t in reader.tensors}
    n_params = sum(int(t.n_elements) for t in reader.tensors)
    quantized = n_params > FP32_MAX_PARAMS
    ctx = int(arch_value(md, "context_length", DEFAULT_MAX_SEQ_LEN))
    max_seq_len = min(ctx, DEFAULT_MAX_SEQ_LEN)
    name = _slug(md.get("general.name") or md.get("general.basename") or path.stem)
    if name in MODELS and MODELS[name].gguf_files != (str(path),):
        name += "-gguf"
    return ModelSpec(
        name=name,
        description=f"{md.get('general.name') or path.stem} ({arch}), from {path}",
        architecture=arch,
        packages=(),
        gguf_files=(str(path),),
        default_quantize="8da4w" if quantized else "none",
        default_embedding_quantize="4bit" if quantized else "none",
        # llama.cpp keeps the output projection wider than the rest (Q6_K in its Q4 types)
        default_output_quantize="8bit" if quantized else "same",
        default_max_seq_len=max_seq_len,
        default_kv_cache="fp32",
        group_size=32,
        eos_token_ids=tuple(eos_ids),
        bos_token_id=int(bos),
        pad_token_id=int(md.get("tokenizer.ggml.padding_token_id", eos)),
        use_hf_rope=arch != "llama",  # llama.cpp permutes only llama's q/k to the interleaved layout
        tied_output="output.weight" not in names,
        split_digits=md.get("tokenizer.ggml.pre") == "smollm",
    )


def file_model_dir(gguf_sha256: str, options: BuildOptions) -> Path:
    return cache_root() / "models" / "gguf" / gguf_sha256[:16] / options.variant


def build_file(path: Path, max_seq_len: Optional[int] = None, quantize: Optional[str] = None,
               embedding_quantize: Optional[str] = None, force: bool = False, verbose: bool = False,
               kv_cache: Optional[str] = None, output_quantize: Optional[str] = None) -> Path:
    """Build the GGUF at ``path`` (a no-op when that file's build exists); returns its directory."""
    import sys

    from .arch import UnsupportedGGUF
    from .build import build
    from .manifest import sha256_file
    from .registry import resolve_options

    try:
        spec = file_spec(path)
    except UnsupportedGGUF:
        raise
    except ValueError as e:  # not a GGUF, a corrupt header, no tokenizer: the file's fault, in one line
        raise UnsupportedGGUF(str(e)) from e
    MODELS[spec.name] = spec  # this process's registry: build() looks the spec up by name
    print(f"{Path(path).name}: {spec.architecture}, served as {spec.name}; checksumming", file=sys.stderr)
    digest = sha256_file(Path(spec.gguf_files[0]))
    options = resolve_options(spec.name, max_seq_len=max_seq_len, quantize=quantize,
                              embedding_quantize=embedding_quantize, kv_cache=kv_cache,
                              output_quantize=output_quantize)
    return build(spec.name, options, out=file_model_dir(digest, options), force=force, verbose=verbose)
