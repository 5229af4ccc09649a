"""Build a model directory: GGUF -> tokenizer files + checkpoint -> ``model.pte`` -> ``etserve.json``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Optional

from . import kv_smoothing
from .manifest import add_checksums, manifest_matches, read_manifest, write_manifest
from .registry import PREFILL_MAX_TOKENS, BuildOptions, get_spec, model_dir


def _dist_version(dist: str) -> Optional[str]:
    try:
        return importlib_metadata.version(dist)
    except importlib_metadata.PackageNotFoundError:
        return None


def _install(tmp: Path, target: Path) -> None:
    """Replace ``target`` by ``tmp`` (both on one filesystem)."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.rename(target, old)
    os.rename(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def build(
    name: str,
    options: BuildOptions,
    out: Optional[Path] = None,
    force: bool = False,
    verbose: bool = False,
    quant_cache: bool = True,
) -> Path:
    """Build ``name`` with ``options`` (no-op if an identical complete build exists); returns its directory."""
    from . import pipeline
    from .progress import Stages
    from .carry import CarriedBlocks
    from .quant_cache import HqqCache, cache_file

    spec = get_spec(name)
    target = model_dir(name, options, out)
    if not force and manifest_matches(read_manifest(target), spec, options):
        if add_checksums(target):  # a build from before the manifest recorded them
            print(f"added the files' SHA-256 to {target}'s manifest", file=sys.stderr)
        print(f"up to date: {target}", file=sys.stderr)
        return target

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the server may run as another user
    work = Path(tempfile.mkdtemp(prefix="etserve-ckpt-"))
    stages = Stages(4 + pipeline.STAGES, prefix=f"{name}: ")
    print(f"building {name} ({options.variant}) into {target}", file=sys.stderr)
    try:
        with stages.stage("locating GGUF"):
            from .gguf_source import locate_gguf
            from .manifest import sha256_file

            gguf_path = locate_gguf(spec)
            source = {
                "packages": [
                    {"name": p.replace("_", "-"), "version": _dist_version(p.replace("_", "-"))} for p in spec.packages
                ],
                "gguf_size": gguf_path.stat().st_size,
                "gguf_sha256": sha256_file(gguf_path),
            }

        with stages.stage("reading GGUF, writing tokenizer files"):
            from .gguf_meta import open_gguf, read_metadata
            from .tokenizer_files import write_tokenizer_files

            from .arch import check_gguf, family

            check_gguf(gguf_path)  # unsupported architecture or tensor type: refused by name, now
            reader = open_gguf(gguf_path)
            md = read_metadata(reader)
            fam = family(spec.architecture)
            tok_cfg = write_tokenizer_files(md, spec, tmp, options.max_seq_len)

        with stages.stage("dequantizing weights to a checkpoint"):
            from .checkpoint import write_checkpoint

            smoothing: dict = {}  # int8 caches: the key smoothing's factors and summary (kv_smoothing.FILE)
            fold = ((lambda sd, p: smoothing.update(kv_smoothing.smooth_keys(sd, p, tmp / "tokenizer.json")))
                    if options.kv_cache == "int8" else None)
            carried = CarriedBlocks() if options.quantize != "none" or options.embedding_quantize != "none" else None
            ckpt, params_path, params = write_checkpoint(reader, md, spec, work, fold=fold, carried=carried)
            del reader, md
            shutil.copyfile(params_path, tmp / "params.json")
            if smoothing:
                (tmp / kv_smoothing.FILE).write_text(json.dumps(smoothing))

        from .export import make_llm_config

        pte = tmp / "model.pte"
        cfg = make_llm_config(
            ckpt, params_path, options,
            group_size=spec.group_size,
            bos_id=tok_cfg["bos_token_id"],
            eos_ids=tok_cfg["eos_token_ids"],
            output=pte,
        )
        quantized = options.quantize != "none" or options.embedding_quantize != "none"
        hqq_cache = HqqCache(cache_file(spec, options, source["gguf_sha256"]) if quantized and quant_cache else None)
        export_started = len(stages.records)
        # without export_llama's second torch.export (a quarter of the wall time): the same bytes
        # (tests/models/test_pipeline.py), now that the mask-free attention holds no mask tensor
        with (fam.transforming() if fam is not None else contextlib.nullcontext()):
            pipeline.export_program(cfg, pte, stages, custom_ops=options.custom_ops, hqq_cache=hqq_cache,
                                    carried=carried,
                                    verbose=verbose, output_8bit=options.output_quantize == "8bit",
                                    native_linears=options.linear_kernel == "etserve",
                                    logit_rows=options.logit_rows)
        export_seconds = sum(r.seconds for r in stages.records[export_started:])

        with stages.stage("writing manifest"):
            write_manifest(tmp, {
                "name": spec.name,
                "architecture": spec.architecture,
                "source": source,
                "max_seq_len": options.max_seq_len,
                "quantize": options.quantize,
                "group_size": spec.group_size if options.quantize != "none" else None,
                "custom_ops": options.custom_ops,
                "embedding_quantize": options.embedding_quantize,
                "kv_cache": options.kv_cache,
                "output_quantize": options.output_quantize,
                "linear_kernel": options.linear_kernel,
                "logit_rows": options.logit_rows,
                "kv_smoothing": kv_smoothing.summary(smoothing) if smoothing else None,
                "prefill_max_tokens": min(options.max_seq_len, PREFILL_MAX_TOKENS + 1) - 1,
                "variant": options.variant,
                "vocab_size": params["vocab_size"],
                "eos_token_ids": tok_cfg["eos_token_ids"],
                "bos_token_id": tok_cfg["bos_token_id"],
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "build_seconds": round(stages.elapsed(), 1),
                "export_seconds": round(export_seconds, 1),
                "peak_rss_mb": stages.peak_rss_mb(),
                # without the checkpoint's mapped file pages, which the kernel can drop (progress.py)
                "peak_anon_mb": stages.peak_anon_mb(),
                "hqq": {"computed": hqq_cache.misses, "replayed": hqq_cache.hits,
                        "seconds": round(hqq_cache.seconds, 1)},
                # the file's Q4_0 weights kept as they are (carry.py): how many of how many
                "q4_0_carried": ({"carried": carried.carried, "q4_0_weights": len(carried),
                                  "requantized_for_xnnpack": carried.requantized,
                                  "scaled_by_a_fold": carried.refolded}
                                 if carried is not None and len(carried) else None),
                "stages": [{"stage": r.label, "seconds": r.seconds, "cpu_seconds": r.cpu_seconds,
                            "peak_rss_mb": r.peak_rss_mb, "peak_anon_mb": r.peak_anon_mb}
                           for r in stages.records],
                "versions": {d: _dist_version(d) for d in ("torch", "executorch", "gguf", "tokenizers")},
            })
            _install(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if stages.records:
            print(stages.summary(), file=sys.stderr)
    print(f"built {target} in {stages.elapsed():.0f}s", file=sys.stderr)
    return target
