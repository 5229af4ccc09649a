"""Run ExecuTorch's LLM exporter on a checkpoint + params file (build time; needs torch + executorch)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

from .registry import EMBEDDING_GROUP_SIZE, BuildOptions


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
    """The ``LlmConfig`` for a KV-cache, dynamic-shape, XNNPACK export of ``options``."""
    from executorch.extension.llm.export.config.llm_config import DtypeOverride, LlmConfig, ModelType

    cfg = LlmConfig()
    cfg.base.model_class = ModelType.llama3  # generic llama; the named classes try the model hub
    cfg.base.checkpoint = str(checkpoint)
    cfg.base.params = str(params)
    cfg.base.metadata = json.dumps({"get_bos_id": bos_id, "get_eos_ids": list(eos_ids)})
    cfg.model.dtype_override = DtypeOverride.fp32
    cfg.model.use_kv_cache = True
    cfg.model.use_sdpa_with_kv_cache = options.custom_ops
    cfg.model.enable_dynamic_shape = True
    cfg.export.max_seq_length = options.max_seq_len
    cfg.export.max_context_length = options.max_seq_len
    cfg.export.output_dir = str(output.parent)
    cfg.export.output_name = str(output)  # absolute: a relative name is taken from the cwd
    cfg.backend.xnnpack.enabled = True
    cfg.backend.xnnpack.extended_ops = True  # without it only dynamically quantized linears are delegated
    if options.quantize == "8da4w":
        cfg.quantization.qmode = "8da4w"
        cfg.quantization.group_size = group_size
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
