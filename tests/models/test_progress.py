"""Build stages end with a table of wall seconds, CPU seconds and each stage's own peak RSS."""

from __future__ import annotations

import io
import mmap
import os
import time

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
    assert table[0].split()[1:] == ["stage", "seconds", "cpu", "s", "peak", "RSS", "peak", "anon"]
    assert [line.split()[1] for line in table[1:]] == ["allocate", "small", "fails", "total"]
    assert table[3].endswith("FAILED")
    assert "tiny: [1/3] allocate 300 MB… " in out.getvalue() and "FAILED after" in out.getvalue()


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_anonymous_peak_counts_allocations_not_mapped_file_pages(tmp_path):
    """A 7B's checkpoint is read through a file map (app/models/checkpoint.py): its pages count in
    RSS while the page cache keeps them, but the kernel can drop them, so the stages also report
    anonymous memory, which must fit in RAM."""
    np = pytest.importorskip("numpy")
    path = tmp_path / "weights.bin"
    with open(path, "wb") as f:
        f.truncate(300 * 1024 * 1024)
    stages = Stages(2, stream=io.StringIO())
    with stages.stage("read a mapped file"):
        mapped = np.memmap(path, dtype=np.uint8, mode="r+")
        mapped[::4096] = 1  # every page resident, file-backed
        del mapped
    with stages.stage("allocate 300 MB"):
        block = np.ones(300 * 1024 * 1024, dtype=np.uint8)  # private anonymous pages
        time.sleep(0.2)  # sampled every 50 ms
        del block
    mapped_stage, allocated = stages.records
    assert mapped_stage.peak_rss_mb >= 300 and mapped_stage.peak_anon_mb < allocated.peak_anon_mb - 250
    assert allocated.peak_anon_mb >= 300
    assert stages.peak_anon_mb() == allocated.peak_anon_mb
