"""Run ExecuTorch's LLM exporter on a checkpoint + params file (build time; needs torch + executorch)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Iterator

from .quantize_hook import wrapping_quantize
from .registry import EMBEDDING_GROUP_SIZE, PREFILL_MAX_TOKENS, BuildOptions

# The attention layer our custom-op exports use (registered by _register_attention, named in the
# params file the exporter reads): ExecuTorch's own, without its max_context_len² causal mask.
MASK_FREE_ATTENTION = "etserve_mha_no_mask"


class _NoMask:
    """The mask of the mask-free attention: ``AttentionMHA.forward`` narrows or indexes it,
    and gets None."""

    def narrow(self, *args) -> None:
        return None

    def __getitem__(self, index) -> None:
        return None


_NO_MASK = _NoMask()
_ROWS = [False]  # inside row_positions(): the attention gets the first row's position only


def _register_attention() -> None:
    """Register ``MASK_FREE_ATTENTION`` with the exporter's attention registry (idempotent).

    ExecuTorch's ``AttentionMHA`` builds a ``max_context_len x max_context_len`` bool causal mask
    per layer, used only when the attention is not the ``llama::custom_sdpa`` op (which is causal
    by position). At a 32k context that is 1 GiB per layer at export time, 24 GiB for Qwen. Our
    subclass builds the layer for a one-position context, then gives it the real KV cache and
    SDPA, and no mask tensor at all: ``self.mask`` is an object whose ``narrow`` and indexing
    give None, the mask the custom SDPA ops (which replace ``SDPA`` in every build that uses
    this attention) ignore. No tensor means nothing for torch.export to lift and nothing for
    any later pass to materialize: a stride-0 view over one byte, tried first, became full
    ``n x n`` buffers during Qwen's torch.export stage (23 GB resident at 32k: the kernel killed
    the build; tests/models/test_build_memory.py).
    """
    import dataclasses

    from executorch.examples.models.llama.attention import (
        ATTENTION_REGISTRY,
        SDPA,
        AttentionMHA,
        register_attention,
    )

    if MASK_FREE_ATTENTION in ATTENTION_REGISTRY:
        return

    @register_attention(MASK_FREE_ATTENTION)
    class MaskFreeAttention(AttentionMHA):
        def __init__(self, args, layer_id, rope, **kwargs):
            super().__init__(dataclasses.replace(args, max_context_len=1), layer_id, rope, **kwargs)
            self.max_context_len = args.max_context_len
            n = args.max_context_len
            del self._buffers["mask"]  # the one-position context's 1 x 1 mask
            object.__setattr__(self, "mask", _NO_MASK)  # not a tensor: nn.Module would refuse it
            if self.use_kv_cache:
                self._init_kv_cache(args)
                self.SDPA = SDPA(
                    dim=self.n_local_heads * self.head_dim,
                    head_dim=self.head_dim,
                    n_rep=self.n_rep,
                    max_context_len=n,
                )

        def forward(self, x, freqs_cos, freqs_sin, **kwargs):
            # A rows build: the rotary rows are already each token's own (row_positions); the
            # cache update and the SDPA take their start from input_pos[0] and our kernels each
            # row's slot and position from the runtime's row table. ``input_pos[-1].item()``
            # (AttentionMHA's bounds check) cannot be traced over a dynamic size: hand the layer
            # the first position alone, a tensor of static size 1.
            input_pos = kwargs.get("input_pos")
            if _ROWS[0] and input_pos is not None and self.use_kv_cache:
                kwargs = dict(kwargs, input_pos=input_pos.narrow(0, 0, 1))
            return super().forward(x, freqs_cos, freqs_sin, **kwargs)


@contextlib.contextmanager
def row_positions() -> Iterator[None]:
    """While active, the llama ``Rope`` takes the rotary rows of each position in ``input_pos``
    (``index_select``) instead of ``narrow``-ing ``seq_len`` rows from ``input_pos[-1]``.

    With it, a rows build's forward takes one cache position per token (``input_pos`` [S]), so
    one call can carry tokens at unrelated positions: decode steps of several sequences (each in
    its own KV slot, which our kernels take from the row table the runtime sets for the call,
    native/src/kv_rows.h) and a speculative draft's tokens. For consecutive positions the rows
    are the same as ``narrow``'s, so a prefill chunk computes what it did.
    """
    from executorch.examples.models.llama.rope import Rope

    original = Rope.get_freqs

    def get_freqs(self, input_pos, seq_len):
        if not (self.params.use_kv_cache and self.params.enable_dynamic_shape):
            return original(self, input_pos, seq_len)
        return self.freqs_cos.index_select(0, input_pos), self.freqs_sin.index_select(0, input_pos)

    Rope.get_freqs = get_freqs
    _ROWS[0] = True
    try:
        yield
    finally:
        Rope.get_freqs = original
        _ROWS[0] = False


def rows_example_inputs(manager, logit_rows: int) -> None:
    """Give ``manager`` (an ``LLMEdgeManager``) the inputs of a rows build: tokens [1, S], their
    cache positions [S] (the token dimension's own size) and ``last_valid_token_pos`` [R], the
    rows whose logits the call returns (1 <= R <= ``logit_rows``): [S - 1] for a prefill chunk,
    every row for decode steps and drafts. ``Transformer.forward`` indexes its last hidden states
    with it, so the output projection runs on those rows only."""
    import torch

    token_dim = manager.dynamic_shapes[0][1]
    rows = torch.export.Dim("logit_rows", min=1, max=logit_rows)
    manager.example_inputs = (
        torch.tensor([[2, 3, 4]], dtype=torch.long),
        {"input_pos": torch.tensor([0, 1, 2], dtype=torch.long),
         "last_valid_token_pos": torch.tensor([1, 2], dtype=torch.long)},
    )
    manager.dynamic_shapes = ({1: token_dim}, {"input_pos": {0: token_dim}, "last_valid_token_pos": {0: rows}})


@contextlib.contextmanager
def output_quantization(eight_bit: bool) -> Iterator[None]:
    """While active (``eight_bit``), the exporter's 8da4w weight transform leaves the output
    projection out of its 4-bit pass and gives it int8 weights with one scale per row instead
    (torchao ``Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, PerAxis(0))``,
    with HQQ scales like the rest): what XNNPACK runs as its qd8-f32-qc8w GEMM.

    Measured on Qwen2.5-Coder-0.5B (eager, 2,048 tokens of bench/data/coriolanus.txt):
    perplexity 94.63 with the 4-bit output projection, 91.77 with 8-bit, 91.74 with fp32. It is
    the one linear whose error lands on the logits directly; llama.cpp's Q4_0 keeps it at Q8_0.
    """
    if not eight_bit:
        yield
        return
    import torch

    def wrap(original):
        def quantize(model, qmode, *args, **kwargs):
            if qmode != "8da4w":
                return original(model, qmode, *args, **kwargs)
            if not isinstance(getattr(model, "output", None), torch.nn.Linear):
                raise RuntimeError(f"8-bit output projection: {type(model).__name__} has no Linear `output`")
            from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
            from torchao.quantization.granularity import PerAxis

            out = model.output
            model.output = torch.nn.Identity()  # not a Linear: the 4-bit pass leaves it alone
            try:
                model = original(model, qmode, *args, **kwargs)
            finally:
                model.output = out
            hqq = kwargs.get("quantize_with_hqq", True)
            quantize_(out, Int8DynamicActivationIntxWeightConfig(
                weight_dtype=torch.int8, weight_granularity=PerAxis(0),
                intx_choose_qparams_algorithm="hqq_scale_only" if hqq else "affine"))
            return model
        return quantize

    with wrapping_quantize(wrap):
        yield


def _params_for_export(params: Path, custom_ops: bool) -> Path:
    """The params file the exporter reads: ``params`` itself, or for custom-op exports a copy
    beside it naming the mask-free attention."""
    if not custom_ops:
        return params
    _register_attention()
    data = json.loads(params.read_text())
    data["attention_type"] = MASK_FREE_ATTENTION
    out = params.with_name(params.stem + ".export.json")
    out.write_text(json.dumps(data, indent=2))
    return out


def make_llm_config(
    checkpoint: Path,
    params: Path,
    options: BuildOptions,
    *,
    group_size: int,
    bos_id: int,
    eos_ids: list[int],
    output: Path,
):
    """The ``LlmConfig`` for a KV-cache, dynamic-shape, XNNPACK export of ``options``.

    The KV cache holds ``options.max_seq_len`` positions (the exporter's ``max_context_length``,
    the .pte's ``get_max_context_len``); one forward call takes at most ``PREFILL_MAX_TOKENS``
    (the exporter's ``max_seq_length``, minus one: the bound of the dynamic token dimension).
    Activation memory is planned for the largest call, so it must not grow with the context.
    """
    from executorch.extension.llm.export.config.llm_config import DtypeOverride, LlmConfig, ModelType

    cfg = LlmConfig()
    cfg.base.model_class = ModelType.llama3  # generic llama; the named classes try the model hub
    cfg.base.checkpoint = str(checkpoint)
    cfg.base.params = str(_params_for_export(params, options.custom_ops))
    cfg.base.metadata = json.dumps({"get_bos_id": bos_id, "get_eos_ids": list(eos_ids)})
    cfg.model.dtype_override = DtypeOverride.fp32
    cfg.model.use_kv_cache = True
    cfg.model.use_sdpa_with_kv_cache = options.custom_ops
    cfg.model.quantize_kv_cache = options.kv_cache == "int8"
    cfg.model.enable_dynamic_shape = True
    cfg.export.max_seq_length = min(options.max_seq_len, PREFILL_MAX_TOKENS + 1)
    cfg.export.max_context_length = options.max_seq_len
    cfg.export.output_dir = str(output.parent)
    cfg.export.output_name = str(output)  # absolute: a relative name is taken from the cwd
    cfg.backend.xnnpack.enabled = True
    cfg.backend.xnnpack.extended_ops = True  # without it only dynamically quantized linears are delegated
    if options.quantize == "8da4w":
        cfg.quantization.qmode = "8da4w"
        cfg.quantization.group_size = group_size
    elif options.quantize == "8da8w":
        cfg.quantization.qmode = "8da8w"
        cfg.quantization.group_size = 0  # one scale per row: XNNPACK's qd8-f32-qc8w
    elif options.quantize != "none":
        raise ValueError(f"unsupported quantize {options.quantize!r}")
    if options.embedding_quantize == "4bit":
        cfg.quantization.embedding_quantize = f"4,{EMBEDDING_GROUP_SIZE}"
    elif options.embedding_quantize != "none":
        raise ValueError(f"unsupported embedding quantize {options.embedding_quantize!r}")
    return cfg


def export_pte(cfg, output: Path, *, custom_ops: bool, verbose: bool = False) -> Path:
    """Export to ``output`` (a ``.pte``); raises if the file was not written."""
    import torch

    if custom_ops:
        import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  the package alone registers nothing
    from executorch.examples.models.llama.export_llama_lib import export_llama

    cfg.debug.verbose = verbose
    captured = io.StringIO()
    quiet = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(captured)
    cwd = os.getcwd()
    os.chdir(output.parent)  # the exporter writes side files (if any) relative to the cwd
    try:
        with torch.no_grad(), quiet:
            export_llama(cfg)
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise
    finally:
        os.chdir(cwd)
    # save_pte_program logs and swallows write errors: check the result ourselves.
    if not output.is_file() or output.stat().st_size == 0:
        raise RuntimeError(f"exporter did not write {output}")
    return output
