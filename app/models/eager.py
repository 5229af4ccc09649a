"""The eager PyTorch model a built ``.pte`` was exported from (build/test time; needs torch + executorch).

ExecuTorch's exporter loads the checkpoint into its llama ``Transformer``, applies source
transforms (8da4w linears quantized by torchao with HQQ scales, 4-bit embeddings, the custom
sdpa and KV-cache modules), then traces that module. ``load_eager_model`` rebuilds the same
module through the exporter's own ``get_llama_model`` with the ``LlmConfig`` our build used,
from a checkpoint regenerated from the GGUF, and stops before tracing: the fair reference for
a quantized export, where transformers on the fp32 GGUF is not.

Run it in its own process: importing ExecuTorch's custom ops registers their kernels in the
same runtime libetserve.so uses, and a second registration of ``llama::update_cache`` aborts.

    python -m app.models.eager MODEL_DIR REQUEST_JSON OUT_NPZ

scores each sequence of REQUEST_JSON, a list of {"tokens": [ids], "from": N} or
{"tokens": [ids], "rows": [i, j, ...]}: the logits the eager model gives at every position (one
forward call from position 0), rows N.. only or the rows listed (only those go through the output
projection: a vocabulary of 152k makes it a fifth of a long prompt's forward), saved as float32
[rows, vocab] arrays arr_0, arr_1, ... in OUT_NPZ.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Sequence


def build_options(manifest: dict):
    """The ``BuildOptions`` a manifest (etserve.json) was built with."""
    from .registry import BuildOptions

    return BuildOptions(
        max_seq_len=manifest["max_seq_len"],
        quantize=manifest["quantize"],
        custom_ops=manifest["custom_ops"],
        embedding_quantize=manifest.get("embedding_quantize", "none"),  # older manifests: none
        kv_cache=manifest.get("kv_cache", "fp32"),
        output_quantize=manifest.get("output_quantize", "same"),
        linear_kernel=manifest.get("linear_kernel", "xnnpack"),  # older manifests: XNNPACK's
    )


def load_eager_model(model_dir: Path, work_dir: Path, kv_cache: str | None = None):
    """The exporter's eager module for the build in ``model_dir``, in eval mode, returning the
    logits of every position. ``work_dir`` receives the checkpoint (~4 bytes a weight).
    ``kv_cache`` ("fp32") swaps the build's cache for another with the same weights: the
    reference an int8-cache build's cache is measured against."""
    import torch

    from .manifest import read_manifest
    from .checkpoint import write_checkpoint
    from .export import make_llm_config
    from .gguf_meta import open_gguf, read_metadata
    from .gguf_source import locate_gguf
    from .registry import get_spec

    manifest = read_manifest(model_dir)
    if manifest is None:
        raise FileNotFoundError(f"no complete build in {model_dir}")
    spec = get_spec(manifest["name"])
    options = build_options(manifest)
    if kv_cache is not None:
        import dataclasses

        options = dataclasses.replace(options, kv_cache=kv_cache)
    reader = open_gguf(locate_gguf(spec))
    from . import kv_smoothing

    fold = None
    if manifest.get("kv_smoothing"):  # an int8-cache build's key smoothing: the same factors again
        saved = json.loads((model_dir / kv_smoothing.FILE).read_text())
        fold = lambda sd, p: kv_smoothing.replay(sd, p, saved)  # noqa: E731
    ckpt, params, _ = write_checkpoint(reader, read_metadata(reader), spec, work_dir, fold=fold)
    del reader
    cfg = make_llm_config(ckpt, params, options, group_size=spec.group_size, bos_id=manifest["bos_token_id"],
                          eos_ids=manifest["eos_token_ids"], output=work_dir / "unused.pte")
    cfg.debug.generate_full_logits = True  # the exported model keeps the last row; we want all of them
    if options.custom_ops:
        import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  torch.ops.llama.*
    from executorch.examples.models.llama.export_llama_lib import get_llama_model

    from .export import output_quantization

    from .checkpoint import shared_map
    from .quant_cache import HqqCache, cache_file

    # torchao's HQQ scale search replayed from the build's own cache (the values the build used,
    # bit for bit; computed where it is missing): it was a minute of each reference's start
    sha = (manifest.get("source") or {}).get("gguf_sha256")
    quantized = options.quantize != "none" or options.embedding_quantize != "none"
    hqq = HqqCache(cache_file(spec, options, sha) if quantized and sha else None)
    with torch.no_grad(), contextlib.redirect_stdout(sys.stderr), shared_map(ckpt), hqq.active(), \
            output_quantization(options.output_quantize == "8bit"):  # it prints what it quantizes
        model, _, _ = get_llama_model(cfg)
    print(hqq.summary(), file=sys.stderr)
    return model.eval()


def _row_projection(output, rows):
    """A module giving ``output``'s projection of the positions ``rows`` only."""
    import torch

    class Rows(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.output = output
            self.register_buffer("rows", torch.tensor(list(rows), dtype=torch.long), persistent=False)

        def forward(self, h):
            return self.output(h[:, self.rows])

    return Rows()


def eager_logits(model, tokens: Sequence[int], rows: Sequence[int] | None = None):
    """float32 [len(tokens), vocab]: the logits at each position, one forward call from 0; with
    ``rows``, [len(rows), vocab]: those positions' (equal to the full call's rows on the Qwen build,
    checked; a matrix library may sum a product of fewer rows in another order)."""
    import torch

    output = getattr(model, "output", None)
    if rows is not None:
        if output is None:
            raise ValueError("this model has no output projection to select rows for")
        model.output = _row_projection(output, rows)
    try:
        with torch.no_grad():
            out = model(torch.tensor([list(tokens)], dtype=torch.long), {"input_pos": torch.tensor([0])})
    finally:
        if rows is not None:
            model.output = output
    if isinstance(out, tuple):
        out = out[0]
    return out[0].float().numpy()


def main(argv: list[str] | None = None) -> None:
    import numpy as np

    p = argparse.ArgumentParser(prog="python -m app.models.eager", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", type=Path)
    p.add_argument("request", type=Path,
                   help='JSON list of {"tokens": [ids], "from": first row to keep} or {"tokens": [ids], "rows": [ids]}')
    p.add_argument("out", type=Path, help=".npz file for the logits")
    p.add_argument("--kv-cache", choices=("fp32", "int8"), default=None,
                   help="the cache to run with (default: the build's); the weights stay the build's")
    args = p.parse_args(argv)
    request = json.loads(args.request.read_text())
    work = Path(tempfile.mkdtemp(prefix="etserve-eager-"))  # no "8da4w"/"int8" in the path
    try:
        model = load_eager_model(args.model_dir, work, args.kv_cache)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the model holds its weights in memory
    np.savez(args.out, *[eager_logits(model, r["tokens"], r["rows"]) if "rows" in r
                         else eager_logits(model, r["tokens"])[r.get("from", 0):] for r in request])


if __name__ == "__main__":
    main()
