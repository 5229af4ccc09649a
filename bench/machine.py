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
