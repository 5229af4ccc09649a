"""app/models/hqq.py computes torchao's HQQ scale search in row blocks on two threads: the library's
values bit for bit, early stop included, for 4- and 8-bit ranges, fp32 and bf16 weights, row counts
that are and are not multiples of the block."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")

from app.models import hqq  # noqa: E402
from app.models.quant_cache import HQQ_FUNCTION, HQQ_MODULE  # noqa: E402


def _library():
    import importlib

    return getattr(importlib.import_module(HQQ_MODULE), HQQ_FUNCTION)


def _weights():
    g = torch.Generator().manual_seed(0)
    yield "fp32", torch.randn(600, 128, generator=g) * 0.05
    yield "bf16", (torch.randn(300, 64, generator=g) * 0.05).to(torch.bfloat16)
    heavy = torch.randn(257, 96, generator=g)
    heavy[::7] *= 40  # outlier rows: scales far apart
    yield "outliers", heavy
    grid = torch.randint(-8, 8, (512, 64), generator=g).float() * 0.01
    yield "exact grid (stops after one pass)", grid
    yield "zeros", torch.zeros(40, 64)


@pytest.mark.parametrize("qmin,qmax", [(-8, 7), (-128, 127)])
@pytest.mark.parametrize("threads", [1, 2])
def test_blocks_give_the_librarys_values(qmin, qmax, threads):
    library = _library()
    for name, w in _weights():
        for kwargs in ({}, {"iters": 1}, {"iters": 3, "early_stop_tol": 0.0}):
            q0, s0 = library(w, [1, 32], qmin, qmax, **kwargs)
            q1, s1 = hqq.scale_only_hqq(w, [1, 32], qmin, qmax, rows=128, threads=threads, **kwargs)
            assert q1.dtype == q0.dtype and s1.dtype == s0.dtype, name
            assert torch.equal(q1, q0) and torch.equal(s1, s0), (name, kwargs)


def test_faster_takes_over_only_the_version_it_reproduces():
    library = _library()
    assert hqq.source_matches(library)  # the installed torchao is the version reimplemented
    fast = hqq.faster(library)
    assert fast is not library and fast.__wrapped__ is library
    w = torch.randn(64, 64)
    torch.manual_seed(1)
    expected = library(w, [1, 32], -8, 7, stochastic=True)
    torch.manual_seed(1)
    got = fast(w, [1, 32], -8, 7, stochastic=True)  # stochastic rounding: the library's own
    assert all(torch.equal(a, b) for a, b in zip(got, expected))

    def other(hp_tensor, block_size, qmin, qmax):
        return library(hp_tensor, block_size, qmin, qmax)

    assert hqq.faster(other) is other


def test_threads_are_restored():
    before = torch.get_num_threads()
    hqq.scale_only_hqq(torch.randn(512, 64), [1, 32], -8, 7, threads=2)
    assert torch.get_num_threads() == before


def test_a_parameter_records_no_autograd_history():
    """Builds quantize ``nn.Parameter`` weights under ``torch.no_grad()``, which the worker threads do
    not inherit: the passes must not be recorded for backward (a build grew to 23 GB)."""
    library = _library()
    w = torch.nn.Parameter(torch.randn(600, 64) * 0.05)
    with torch.no_grad():
        q0, s0 = library(w, [1, 32], -8, 7)
        q1, s1 = hqq.scale_only_hqq(w, [1, 32], -8, 7, rows=128, threads=2)
    assert not q1.requires_grad and not s1.requires_grad
    assert torch.equal(q1, q0) and torch.equal(s1, s0)
