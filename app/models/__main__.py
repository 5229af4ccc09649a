"""Command line: ``python -m app.models {build,build-gguf,path,list,verify,pack,unpack} ...``."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Optional, Sequence

from .registry import (EMBEDDING_QUANTIZE_CHOICES, KV_CACHE_CHOICES, LINEAR_KERNEL_CHOICES, MODELS, OUTPUT_QUANTIZE_CHOICES, QUANTIZE_CHOICES,
                       model_dir, resolve_options)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=sorted(MODELS), help="model name")
    p.add_argument("--max-seq-len", type=int, default=None, help="context length (default per model)")
    p.add_argument("--quantize", choices=QUANTIZE_CHOICES, default=None,
                   help="weight quantization: 8da4w (4-bit linears), 8da8w (8-bit linears: closer to a Q5-Q8 "
                        "GGUF, twice the bytes) or none (default per model)")
    p.add_argument("--embedding-quantize", choices=EMBEDDING_QUANTIZE_CHOICES, default=None,
                   help="embedding table quantization (default per model)")
    p.add_argument("--kv-cache", choices=KV_CACHE_CHOICES, default=None,
                   help="KV cache storage (default per model; int8 needs the custom ops)")
    p.add_argument("--output-quantize", choices=OUTPUT_QUANTIZE_CHOICES, default=None,
                   help="output projection: as the other linears, or 8-bit per row (default per model)")
    p.add_argument("--linear-kernel", choices=LINEAR_KERNEL_CHOICES, default=None,
                   help="who runs the 4-bit linears: our kernel or XNNPACK's (default: etserve)")
    p.add_argument("--custom-ops", action=argparse.BooleanOptionalAction, default=None,
                   help="export with llama::custom_sdpa / llama::update_cache")
    p.add_argument("--out", default=None, help="model directory (default: under the cache root)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m app.models", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build a model directory")
    _add_model_args(b)
    b.add_argument("--force", action="store_true", help="rebuild even if a complete build exists")
    b.add_argument("--verbose", action="store_true", help="show the exporter's output")
    b.add_argument("--no-quant-cache", dest="quant_cache", action="store_false",
                   help="recompute the HQQ quantization even if a build at another context length cached it")
    g = sub.add_parser("build-gguf",
                       help="build any supported GGUF file (cached by its checksum); prints the directory")
    g.add_argument("file", help="a .gguf file (llama, qwen2, qwen3, phi3 or gemma3 architecture)")
    g.add_argument("--max-seq-len", type=int, default=None, help="context length (default from the file)")
    g.add_argument("--quantize", choices=QUANTIZE_CHOICES, default=None,
                   help="weight quantization (default: none up to 1B parameters, else 8da4w; 8da8w: 8-bit "
                        "linears, closer to a Q5-Q8 file, twice the bytes)")
    g.add_argument("--embedding-quantize", choices=EMBEDDING_QUANTIZE_CHOICES, default=None)
    g.add_argument("--kv-cache", choices=KV_CACHE_CHOICES, default=None,
                   help="KV cache storage (default fp32; int8 quarters a long context's cache)")
    g.add_argument("--output-quantize", choices=OUTPUT_QUANTIZE_CHOICES, default=None,
                   help="output projection: 8bit (the default with 8da4w) or the same 4 bits as the linears")
    g.add_argument("--force", action="store_true", help="rebuild even if a complete build exists")
    g.add_argument("--verbose", action="store_true", help="show the exporter's output")
    _add_model_args(sub.add_parser("path", help="print the directory build would produce"))
    sub.add_parser("list", help="known models and their defaults")
    v = sub.add_parser("verify", help="compare the built .pte with a reference model on the same GGUF")
    _add_model_args(v)
    v.add_argument("--prompt", default=None, help="user message (default: a short question)")
    v.add_argument("--new-tokens", type=int, default=32, help="greedy tokens to compare")
    v.add_argument("--ignore-eos", action="store_true", help="always generate --new-tokens tokens")
    v.add_argument("--no-reference", action="store_true", help="only run the .pte and print its text")
    v.add_argument("--against", choices=("auto", "transformers", "eager"), default="auto",
                   help="transformers (fp32), or eager: the exporter's eager module with the build's "
                        "quantization (auto: transformers for fp32 builds, eager for quantized ones)")
    k = sub.add_parser("pack", help="one archive of a built model (NAME-VARIANT.tar) and its .sha256, "
                                    "to serve it on another machine")
    _add_model_args(k)
    k.add_argument("--dest", default=".", help="directory for the archive (default: the current one)")
    u = sub.add_parser("unpack", help="extract a pack archive, checked against its checksums")
    u.add_argument("archive", help="NAME-VARIANT.tar (its .sha256 beside it is checked when present)")
    u.add_argument("--out", default=None,
                   help="model directory to create (default: where build puts it, so --model NAME finds it)")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "list":
        for name, spec in MODELS.items():
            opts = resolve_options(name)
            print(f"{name:20s} {opts.variant:22s} {spec.description}")
        return 0
    if args.command == "unpack":
        from .manifest import ManifestError
        from .pack import unpack

        try:
            print(unpack(Path(args.archive), Path(args.out) if args.out else None))
        except (ManifestError, OSError) as e:
            print(f"unpack: {e}", file=sys.stderr)
            return 1
        return 0
    if args.command == "build-gguf":
        from .arch import UnsupportedGGUF
        from .gguf_file import build_file

        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
        try:
            print(build_file(Path(args.file), args.max_seq_len, args.quantize, args.embedding_quantize,
                             force=args.force, verbose=args.verbose, kv_cache=args.kv_cache,
                             output_quantize=args.output_quantize))
        except (UnsupportedGGUF, FileNotFoundError, IsADirectoryError) as e:
            print(f"build-gguf: {e}", file=sys.stderr)
            return 2
        except ModuleNotFoundError as e:
            print(f"build-gguf: building a model needs the build extras ({e.name} is not installed): "
                  "pip install 'etserve[build]'", file=sys.stderr)
            return 2
        return 0
    opts = resolve_options(args.name, args.max_seq_len, args.quantize, args.custom_ops, args.embedding_quantize,
                           args.kv_cache, args.output_quantize, args.linear_kernel)
    out = model_dir(args.name, opts, args.out)
    if args.command == "path":
        print(out)
        return 0
    if args.command == "build":
        from .build import build

        # Turn SIGTERM into SystemExit so the temp dirs are removed.
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))

        print(build(args.name, opts, out=out, force=args.force, verbose=args.verbose, quant_cache=args.quant_cache))
        return 0
    if args.command == "verify":
        from .verify import verify

        report = verify(args.name, out, prompt=args.prompt, new_tokens=args.new_tokens,
                        reference=not args.no_reference, ignore_eos=args.ignore_eos, against=args.against)
        return 0 if report.get("ok", True) else 1
    if args.command == "pack":
        from .manifest import ManifestError
        from .pack import pack

        try:
            archive, digest = pack(out, Path(args.dest))
        except (ManifestError, OSError) as e:
            print(f"pack: {e}", file=sys.stderr)
            return 1
        print(f"{archive}\nsha256 {digest} (also in {archive.name}.sha256)")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
