"""Build stages end with a table of wall seconds, CPU seconds and each stage's own peak RSS."""

from __future__ import annotations

import io
import mmap
import os

import pytest

from app.models.progress import Stages


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_summary_has_each_stages_own_peak_and_cpu():
    out = io.StringIO()
    stages = Stages(3, stream=out, prefix="tiny: ")
    with stages.stage("allocate 300 MB"):
        # mapped and unmapped by hand: a bytearray's memory goes back through malloc, which
        # in a long-lived test process need not return it to the system (the next stage's
        # peak would then start at this one's)
        block = mmap.mmap(-1, 300 * 1024 * 1024)
        for offset in range(0, len(block), 4096):  # touch every page
            block[offset] = 1
        block.close()
    with stages.stage("small"):
        sum(range(200_000))
    with pytest.raises(RuntimeError):
        with stages.stage("fails"):
            raise RuntimeError("boom")
    big, small, failed = stages.records
    assert big.peak_rss_mb >= 300 and small.peak_rss_mb < big.peak_rss_mb - 250  # not the process's old peak
    assert big.ok and small.ok and not failed.ok
    assert stages.peak_rss_mb() >= 300
    assert all(r.cpu_seconds >= 0 for r in stages.records)
    table = stages.summary().splitlines()
    assert table[0].split()[1:] == ["stage", "seconds", "cpu", "s", "peak", "RSS"]
    assert [line.split()[1] for line in table[1:]] == ["allocate", "small", "fails", "total"]
    assert table[3].endswith("FAILED")
    assert "tiny: [1/3] allocate 300 MB… " in out.getvalue() and "FAILED after" in out.getvalue()
