"""torchao's HQQ scale search (``_choose_qparams_and_quantize_scale_only_hqq``), computed in row
blocks on two threads: the same values, several times faster (build time; needs torch + torchao).

The library runs each of its (up to) twenty least-squares passes over the whole weight, a dozen
whole-tensor temporaries per pass: for the 151,936 x 896 output projection and embedding table
that is memory traffic on one core (the ops' own threads do not help; 51 s for the output
projection alone on the 2-core build machine). Every row block of the weight is independent of the
others but for the early stop, which compares the largest relative scale change of the whole
weight with the tolerance after each pass. ``scale_only_hqq`` keeps that: each pass runs over
256-row blocks (cache-sized) split between two threads (torch releases the GIL in its kernels;
intra-op threads set to one meanwhile), then takes the maximum of the blocks' changes, which is the
whole weight's, and stops or goes on as the library does. Elementwise operations and per-group sums
over the last dimension give each element what the whole-tensor ones give: the results are the
library's, bit for bit (tests/models/test_hqq.py; and the default build's ``model.pte`` is
byte-identical).

``scale_only_hqq`` takes over only from the library version it was written against (the source is
compared); otherwise, and for stochastic rounding, the library's function runs.
"""

from __future__ import annotations

import hashlib
import inspect
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List

from .cpus import usable_cpus

# sha256 of the source of torchao's function this reimplements (torchao 0.18.0): another version runs as is
LIBRARY_SOURCE_SHA256 = "10aca3ea066078ff17df18ba80a98a28301462eb7ada52191f9ac6f24337c2c4"
ROWS = 256  # rows per block: 256 x 896 fp32 is under 1 MB


def source_matches(fn: Callable) -> bool:
    """Whether ``fn`` is the library function ``scale_only_hqq`` reproduces."""
    try:
        source = inspect.getsource(inspect.unwrap(fn))
    except (OSError, TypeError):
        return False
    return hashlib.sha256(source.encode()).hexdigest() == LIBRARY_SOURCE_SHA256


def scale_only_hqq(hp_tensor, block_size: List[int], qmin: int, qmax: int, *, iters: int = 20,
                   stochastic: bool = False, early_stop_tol: float = 1e-5, rows: int = ROWS, threads: int = 0):
    """``_choose_qparams_and_quantize_scale_only_hqq`` (deterministic rounding) in row blocks:
    ``(qdata int32 [out, in], scale [out, in // group_size] in hp_tensor's dtype)``."""
    import torch

    assert not stochastic, "stochastic rounding: use the library function"
    assert hp_tensor.ndim == 2, "hp_tensor must be 2D [out, in]"
    assert isinstance(block_size, (list, tuple)) and len(block_size) == 2
    assert block_size[0] == 1 and block_size[1] >= 1, "block_size must be [1, group_size]"
    assert qmin < qmax, "qmin must be < qmax"
    eps = torch.finfo(torch.float32).eps
    n, k = hp_tensor.shape
    group_size = int(block_size[1])
    assert k % group_size == 0, f"in_features={k} must be divisible by group_size={group_size}"
    n_groups = k // group_size
    W = hp_tensor.detach().to(torch.float32).contiguous()  # no autograd: grad mode is per thread
    qabs = max(abs(qmin), abs(qmax)) or 1
    spans = [(a, min(a + rows, n)) for a in range(0, n, rows)]
    blocks = [W[a:b].view(b - a, n_groups, group_size) for a, b in spans]
    scale = torch.empty(n, n_groups, dtype=torch.float32)
    prev = torch.empty(n, n_groups, dtype=torch.float32)

    def init(i: int) -> None:
        a, b = spans[i]
        s = (blocks[i].abs().amax(dim=2) / qabs).clamp_min(eps)
        scale[a:b] = s
        prev[a:b] = s

    def step(i: int):
        a, b = spans[i]
        wg = blocks[i]
        qg = (wg / scale[a:b].unsqueeze(-1)).round().clamp(qmin, qmax)
        num = (wg * qg).sum(dim=2, dtype=torch.float32)
        den = (qg * qg).sum(dim=2, dtype=torch.float32)
        p = prev[a:b]
        s = torch.where(den > 0, num / den, p).clamp_min(eps).abs()
        scale[a:b] = s
        return ((s - p).abs() / p.clamp_min(eps)).max()

    qdata = torch.empty(n, k, dtype=torch.int32)

    def final(i: int) -> None:
        a, b = spans[i]
        qg = (blocks[i] / scale[a:b].unsqueeze(-1)).round().clamp(qmin, qmax)
        qdata[a:b] = qg.view(b - a, k).to(torch.int32)

    threads = threads or usable_cpus("ETSERVE_HQQ_THREADS")
    saved = torch.get_num_threads()
    pool = ThreadPoolExecutor(threads) if threads > 1 and len(spans) > 1 else None

    def run(fn, items):
        if pool is None:
            return map(fn, items)

        def no_grad_fn(i):  # the pool's threads start in grad mode: a weight that is a Parameter
            with torch.no_grad():  # would record every pass for backward (tens of GB)
                return fn(i)

        return pool.map(no_grad_fn, items)

    try:
        torch.set_num_threads(1)  # the blocks are the parallelism
        list(run(init, range(len(spans))))
        for _ in range(max(1, iters)):
            rel = max(run(step, range(len(spans))))  # the whole weight's largest change
            if rel < early_stop_tol:
                break
            prev.copy_(scale)
        list(run(final, range(len(spans))))
    finally:
        torch.set_num_threads(saved)
        if pool is not None:
            pool.shutdown()
    return qdata, scale.to(hp_tensor.dtype)


def faster(fn: Callable) -> Callable:
    """``fn`` (torchao's HQQ function) computed by ``scale_only_hqq`` when it is the version that
    reproduces and the rounding is deterministic."""
    if not source_matches(fn):
        return fn

    def hqq(hp_tensor, block_size, qmin, qmax, **kwargs):
        if kwargs.get("stochastic") or set(kwargs) - {"iters", "early_stop_tol", "stochastic"}:
            return fn(hp_tensor, block_size, qmin, qmax, **kwargs)
        return scale_only_hqq(hp_tensor, block_size, qmin, qmax, **kwargs)

    hqq.__wrapped__ = fn
    return hqq
