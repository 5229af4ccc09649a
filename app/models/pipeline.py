"""The exporter's steps for our one kind of build, run one by one as timed build stages
(build time; needs torch + executorch).

``export_llama`` (ExecuTorch's ``_export_llama``) with our ``LlmConfig`` (app/models/export.py) does:
load the checkpoint into the llama ``Transformer`` and apply the source transforms (torchao's 8da4w
quantization with HQQ scales, 4-bit embeddings, the custom sdpa/KV-cache modules), ``torch.export``
it, remove redundant transposes, lower to XNNPACK (``to_edge_transform_and_lower`` with the
dynamic-quantization partitioner, then the general one), ``to_executorch``, and write the ``.pte``.
This module runs those same library calls in the same order, so the program is the one
``export_llama`` writes, with four differences in how, not what:

- each step is a stage of the build, so the closing summary says where the time went;
- torchao's HQQ scale search goes through ``quant_cache.HqqCache`` (replayed at other context lengths);
- the pt2e quantization and etrecord paths, which our config never takes, are not entered;
- ``LLMEdgeManager.to_edge_transform_and_lower`` exports the already exported graph a second time
  (strict ``torch.export`` of its ``.module()``, then ``run_decompositions``), so that graph changes
  made by pt2e quantization reach the program; with no pt2e quantizer the only change is the
  redundant-transpose pass, which ``reexport=False`` (the default) applies to the exported program
  itself and hands that to ``to_edge_transform_and_lower``. On a profiled Qwen build the second
  export was a quarter of the wall time; tests/models/test_pipeline.py checks both ways write
  ``export_llama``'s bytes.

Any other configuration is refused (``check_config``) rather than exported differently.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path
from typing import Iterator, Optional

from .checkpoint import shared_map
from .export import output_quantization, row_positions, rows_example_inputs
from .linear_q4 import swapping_linears
from .lowering import faster_lowering, shared_provenance
from .progress import Stages
from .carry import CarriedBlocks
from .quant_cache import HqqCache

STAGES = 4  # the build stages export_program adds


def check_config(cfg) -> None:
    """Refuse what export_program does not reproduce of ``_export_llama``."""
    problems = []
    if not cfg.backend.xnnpack.enabled:
        problems.append("backend other than XNNPACK")
    for name in ("qnn", "vulkan", "coreml", "mlx", "openvino", "tosa", "ethosu", "vgf"):
        backend = getattr(cfg.backend, name, None)
        if backend is not None and getattr(backend, "enabled", False):
            problems.append(f"backend {name}")
    if cfg.multimethod.enabled:
        problems.append("multimethod export")
    if cfg.quantization.pt2e_quantize:
        problems.append("pt2e quantization")
    if getattr(cfg.model, "static_quantize_kv_cache", False):
        problems.append("static quantized KV cache")
    if cfg.model.use_attention_sink:
        problems.append("attention sink")
    if cfg.export.export_only or cfg.debug.generate_etrecord or cfg.debug.profile_memory or cfg.debug.profile_path:
        problems.append("export-only / etrecord / profiling")
    if cfg.export.foundation_weights_file or cfg.export.lora_weights_file:
        problems.append("external weight files")
    if problems:
        raise ValueError("app.models.pipeline does not export: " + ", ".join(problems))


@contextlib.contextmanager
def _quiet(verbose: bool) -> Iterator[None]:
    """The exporter prints what it quantizes on stdout: keep it for errors only, unless verbose."""
    if verbose:
        yield
        return
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            yield
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise


@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:
    cwd = os.getcwd()
    os.chdir(path)  # the exporter writes side files (if any) relative to the cwd
    try:
        yield
    finally:
        os.chdir(cwd)


def export_program(cfg, output: Path, stages: Stages, *, custom_ops: bool, hqq_cache: Optional[HqqCache] = None,
                   carried: Optional[CarriedBlocks] = None, verbose: bool = False, reexport: bool = False,
                   output_8bit: bool = False,
                   native_linears: bool = False, logit_rows: int = 0) -> Path:
    """Export ``cfg`` to ``output`` (a ``.pte``) in ``STAGES`` stages of ``stages``; ``output_8bit``:
    the output projection gets 8-bit weights (export.output_quantization); ``native_linears``: the
    4-bit linears call ``etserve::linear_q4`` instead of going to XNNPACK (linear_q4.py);
    ``logit_rows``: a rows build (export.rows_example_inputs), returning logits for up to that
    many rows of a call, each token at its own position. ``carried``: the GGUF's Q4_0 weights
    keep their own blocks instead of HQQ's (carry.py)."""
    import torch

    if custom_ops:
        import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  the package alone registers nothing
    from executorch.examples.models.llama import export_llama_lib as lib
    from executorch.extension.llm.export.partitioner_lib import get_xnnpack_partitioner

    check_config(cfg)
    cfg.debug.verbose = verbose
    lib._validate_args(cfg)
    _, quantizers, _ = lib.get_quantizer_and_quant_params(cfg)
    if quantizers:
        raise ValueError("app.models.pipeline does not export with pt2e quantizers")
    hqq_cache = hqq_cache or HqqCache(None)
    carried = carried if carried is not None else CarriedBlocks()
    enable_bf16 = cfg.backend.xnnpack.enable_bf16

    with _cwd(output.parent), torch.no_grad(), _quiet(verbose):
        with stages.stage("loading the checkpoint, quantizing (HQQ), source transforms"), hqq_cache.active(), \
                carried.active(), swapping_linears(native_linears), output_quantization(output_8bit), \
                carried.for_xnnpack(), shared_map(Path(cfg.base.checkpoint)):
            manager = lib._prepare_for_llama_export(cfg)
        print(hqq_cache.summary(), file=sys.stderr)
        if len(carried):
            print(carried.summary(), file=sys.stderr)
        if hqq_cache.save():
            print(f"saved the quantization cache {hqq_cache.path}", file=sys.stderr)

        if logit_rows:
            rows_example_inputs(manager, logit_rows)
        with stages.stage("torch.export"), (row_positions() if logit_rows else contextlib.nullcontext()):
            if reexport:
                manager.export()
                manager.run_canonical_optimizations()
            else:
                from executorch.extension.llm.export.export_passes import RemoveRedundantTransposes

                program = manager._export()
                for p in manager.canonical_passes:
                    assert isinstance(p, RemoveRedundantTransposes), p
                    p(program.graph_module)

        with stages.stage("to_edge_transform_and_lower (XNNPACK)"):
            partitioners = [get_xnnpack_partitioner(dynamic_quant_only_partitioner=True, enable_bf16=enable_bf16)]
            if cfg.backend.xnnpack.extended_ops:
                partitioners.append(get_xnnpack_partitioner(dynamic_quant_only_partitioner=False,
                                                            enable_bf16=enable_bf16))
            # the same program, faster (app/models/lowering.py); ``program`` is _export's
            # run_decompositions({}) with transposes removed: functional
            with faster_lowering(functional=() if reexport else (program,)) as decompositions:
                if reexport:
                    manager = manager.to_edge_transform_and_lower(partitioners)
                else:
                    from executorch.exir import to_edge_transform_and_lower

                    manager.edge_manager = to_edge_transform_and_lower(
                        program, partitioner=partitioners, compile_config=manager._get_edge_config(),
                        constant_methods=manager.metadata)
            skipped = sum(1 for _, skip in decompositions if skip)
            print(f"run_decompositions: {len(decompositions) - skipped} run, {skipped} skipped (nothing to decompose)",
                  file=sys.stderr)
            if verbose:
                from executorch.devtools.backend_debug import print_delegation_info

                print_delegation_info(manager.edge_manager.exported_program().graph_module)

        with stages.stage("to_executorch, writing model.pte"), shared_provenance():
            manager = manager.to_executorch(passes=[])
            manager.save_to_pte(str(output))
    # save_pte_program logs and swallows write errors: check the result ourselves.
    if not output.is_file() or output.stat().st_size == 0:
        raise RuntimeError(f"exporter did not write {output}")
    return output
