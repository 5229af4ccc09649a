"""The peer the bench measures etserve against: llama.cpp's server, built from source.

The source is the copy of llama.cpp vendored in the `llama-cpp-python` sdist (fetched with pip, the
registry's ordinary client). It is built once into a cache outside the repository
(~/.cache/etserve/peer/, or $ETSERVE_PEER_DIR), never installed into the venv, never committed and
never used at serving time. Only three programs are built: llama-server, llama-quantize and
llama-perplexity (~20 minutes on 2 cores).

    python -m bench.peer build      # build when missing (idempotent); `make bench-peer`
    python -m bench.peer path       # the directory of the built programs
    python -m bench.peer gguf       # make the comparable Q4_0 GGUF of the default model

The comparable model: the same Qwen2.5-Coder-0.5B GGUF our build is made from, requantized to
Q4_0 (4-bit, the closest to our 8da4w default) with llama-quantize.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "llama-cpp-python"
TARGETS = ("llama-server", "llama-quantize", "llama-perplexity")
CMAKE_OPTIONS = ("-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DCMAKE_BUILD_TYPE=Release")
# x86 instruction sets ggml may use, by /proc/cpuinfo flag. ggml's default (GGML_NATIVE,
# -march=native) also turns on AMX where the CPU lists it, and on these VMs (Sapphire Rapids
# guests) its AMX matmul dies on the first tile instruction (SIGILL: the guest does not enable
# the tile state), so the build names every other set the CPU has instead. Our runtime
# (XNNPACK) gets no AMX either.
X86_SETS = (("sse4_2", "GGML_SSE42"), ("f16c", "GGML_F16C"), ("fma", "GGML_FMA"), ("bmi2", "GGML_BMI2"),
            ("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("avx_vnni", "GGML_AVX_VNNI"),
            ("avx512bw", "GGML_AVX512"), ("avx512vbmi", "GGML_AVX512_VBMI"),
            ("avx512_vnni", "GGML_AVX512_VNNI"), ("avx512_bf16", "GGML_AVX512_BF16"))
QUANT = "Q4_0"


def peer_root() -> Path:
    env = os.environ.get("ETSERVE_PEER_DIR")
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("ETSERVE_CACHE", "~/.cache/etserve")).expanduser()
    return base / "peer"


def bin_dir() -> Path:
    return peer_root() / "llama.cpp" / "build" / "bin"


def program(name: str) -> Path:
    return bin_dir() / name


def options() -> list[str]:
    return [*CMAKE_OPTIONS, *isa_options()]


def is_built() -> bool:
    """The programs are there, built with today's options (a cache built otherwise is rebuilt:
    incrementally, in place)."""
    stamp = peer_root() / "OPTIONS"
    return (all(os.access(program(t), os.X_OK) for t in TARGETS) and stamp.is_file()
            and stamp.read_text().split() == options())


def version() -> str:
    stamp = peer_root() / "SOURCE"
    return stamp.read_text().strip() if stamp.is_file() else "unknown"


def isa_options() -> list[str]:
    """GGML_NATIVE off and each instruction set this x86 CPU lists on (AMX off); elsewhere, the
    default native build."""
    try:
        flags = set(next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split(":")[1].split())
    except (OSError, StopIteration):
        return []
    if "avx2" not in flags:
        return []
    return ["-DGGML_NATIVE=OFF", *(f"-D{option}={'ON' if flag in flags else 'OFF'}" for flag, option in X86_SETS),
            "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]


def _log(msg: str) -> None:
    print(f"[peer] {msg}", file=sys.stderr, flush=True)


def _fetch_source(root: Path) -> Path:
    """Download and unpack the sdist; return its vendored llama.cpp (moved to root/llama.cpp)."""
    target = root / "llama.cpp"
    if (target / "CMakeLists.txt").is_file():
        return target
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        _log(f"pip download {PACKAGE} (sdist)")
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--no-binary", ":all:", "--dest", tmp, PACKAGE], check=True)
        sdist = next(Path(tmp).glob("*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        top = next(p for p in Path(tmp).iterdir() if p.is_dir())
        vendored = top / "vendor" / "llama.cpp"
        if not (vendored / "CMakeLists.txt").is_file():
            raise SystemExit(f"{sdist.name} has no vendor/llama.cpp")
        shutil.move(str(vendored), target)
        (root / "SOURCE").write_text(f"{sdist.name} (vendor/llama.cpp)\n")
    return target


def build(jobs: int = 2) -> Path:
    """Build the peer's programs when missing; return their directory."""
    if is_built():
        return bin_dir()
    root = peer_root()
    root.mkdir(parents=True, exist_ok=True)
    src = _fetch_source(root)
    _log(f"building {', '.join(TARGETS)} in {src / 'build'} (about 20 minutes on 2 cores)")
    subprocess.run(["cmake", "-S", str(src), "-B", str(src / "build"), *options()], check=True)
    subprocess.run(["cmake", "--build", str(src / "build"), "--target", *TARGETS, "-j", str(jobs)],
                   check=True)
    (root / "OPTIONS").write_text("\n".join(options()) + "\n")
    if not is_built():
        raise SystemExit(f"build finished but {bin_dir()} lacks one of {TARGETS}")
    return bin_dir()


def gguf_path() -> Path:
    return peer_root() / "models" / f"qwen2.5-coder-0.5b-{QUANT.lower()}.gguf"


def make_gguf() -> Path:
    """The Qwen GGUF our default build comes from, requantized to Q4_0 with llama-quantize."""
    out = gguf_path()
    if out.is_file():
        return out
    if not is_built():
        raise SystemExit("the peer is not built: python -m bench.peer build")
    from bench.models import source_gguf

    src = source_gguf()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    _log(f"llama-quantize {src} -> {out} ({QUANT})")
    subprocess.run([str(program("llama-quantize")), "--allow-requantize", str(src), str(tmp), QUANT, "2"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("build", "path", "gguf"))
    parser.add_argument("-j", "--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == "build":
        print(build(args.jobs))
    elif args.command == "path":
        print(bin_dir())
    else:
        print(make_gguf())
    return 0


if __name__ == "__main__":
    sys.exit(main())
