"""The machine the bench runs on: its memory bandwidth and its load."""

from __future__ import annotations

import os
import threading
import time


def memory_bandwidth(threads: int, gib: float = 1.0, reps: int = 3) -> float:
    """Bytes/s of a numpy copy of a `gib` GiB array split over `threads` threads (numpy releases
    the GIL while copying), best of `reps`; bytes read plus bytes written, as STREAM counts."""
    import numpy as np

    src = np.ones(int(gib * 2**30) // 8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    bounds = np.linspace(0, len(src), threads + 1, dtype=int)
    parts = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    best = float("inf")
    for _ in range(reps):
        workers = [threading.Thread(target=np.copyto, args=(dst[p], src[p])) for p in parts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (x86 `model name`, ARM `Model` or its part)."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return "unknown CPU"
    for key in ("model name", "Model", "Hardware", "CPU part"):
        for line in text.splitlines():
            if line.split(":")[0].strip() == key:
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def cpu_tier() -> str:
    """The instruction-set tier the CPU offers the kernels, from its flags: AMX, AVX-512 VNNI,
    AVX-512, AVX2, baseline x86-64 (or the ARM features)."""
    try:
        flags: set[str] = set()
        for line in open("/proc/cpuinfo"):
            if line.split(":")[0].strip() in ("flags", "Features"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        return "unknown"
    if "asimd" in flags:
        return "aarch64 (" + ", ".join(f for f in ("asimd", "asimddp", "i8mm", "sve") if f in flags) + ")"
    tiers = [("AMX", {"amx_tile", "amx_int8"}), ("AVX-512 VNNI", {"avx512_vnni"}), ("AVX-512", {"avx512f", "avx512bw"}),
             ("AVX2", {"avx2", "fma"})]
    have = [name for name, need in tiers if need <= flags]
    return " + ".join(have) if have else "baseline x86-64"


def native_build() -> str:
    """What the loaded libetserve.so was built for and which attention kernel it picks here."""
    try:
        from app.engine import native

        lib = native.library()
        forced = os.environ.get("ETSERVE_ISA")
        return (f"built for {lib.ets_vector_isa().decode()}" + (f" (ETSERVE_ISA={forced})" if forced else "")
                + f"; int8-KV attention: {native.int8_attention(lib)}")
    except Exception as e:  # the page still gets written without a library
        return f"native library not loaded ({e})"
