"""Build stages end with a table of wall seconds, CPU seconds and each stage's own peak RSS."""

from __future__ import annotations

import io
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

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
    anonymous memory, which must fit in RAM. Measured in a fresh process: in the test session's
    own, memory earlier tests freed stays with the allocator and the 300 MB would reuse it."""
    pytest.importorskip("numpy")
    code = f"""
import io, json, time
import numpy as np
from app.models.progress import Stages
path = {str(tmp_path / "weights.bin")!r}
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
print(json.dumps([[r.peak_rss_mb, r.peak_anon_mb] for r in stages.records] + [stages.peak_anon_mb()]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout
    (mapped_rss, mapped_anon), (_, allocated_anon), overall = json.loads(out.strip().splitlines()[-1])
    assert mapped_rss >= 300 and mapped_anon < allocated_anon - 250
    assert allocated_anon >= 300
    assert overall == allocated_anon
