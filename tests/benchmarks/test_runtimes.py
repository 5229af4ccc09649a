"""The bench's runtime workers (bench/runtimes.py) on the real test model: the rows the bench
compares against ExecuTorch's own kernels need both runtimes to run the .pte etserve builds.
The whole `make bench` of 2e7be1a printed "n/a: ... error: 0x12" for that row: the rows build's
forward takes three inputs (tokens, each token's position, the logit rows) and the `et` worker
passed two."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.workers import Worker  # noqa: E402


@pytest.mark.parametrize("kind", ["ours", "et"])
def test_each_runtime_decodes_the_test_model(kind, model_dir):
    with Worker(kind, model_dir, 1) as worker:
        assert worker.info["vocab"] > 1000
        [out] = worker.call("decode", fills=[40], steps=4)
    assert out["fill"] == 40
    assert out["decode_tok_s"] > 0 and out["prefill_tok_s"] > 0


def test_a_worker_masked_to_avx2_runs_the_avx2_kernels(model_dir):
    """The bench's AVX2-tier rows on a bigger host (bench/own.py FILL_12K_AVX2): the worker's
    CPUID is masked (native/build/libcpu_mask.so), so our library and XNNPACK choose as on an
    AVX2-only CPU, and the worker says so."""
    from bench.machine import cpu_tier

    if "AVX2" not in cpu_tier():
        pytest.skip(f"this CPU has no AVX2 tier ({cpu_tier()})")
    with Worker("ours", model_dir, 1, cpu_mask="avx2") as worker:
        assert worker.info["cpu_mask"] == "avx2"
        assert worker.info["isa"] == "avx2", worker.info
        [out] = worker.call("decode", fills=[40], steps=2)
    assert out["decode_tok_s"] > 0
