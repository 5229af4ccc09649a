"""The default model's build fits the machines it is built on (24 GiB, 2 cores): its manifest
records the build's peak RSS. A 32k build once held a 32768 x 32768 causal mask per layer
(24 GiB for Qwen) and was killed by the kernel mid-export; the mask-free attention
(app/models/export.py) is what keeps it near 6 GB. This checks the build the suite serves,
which a fresh machine or CI builds with the code under test."""

from __future__ import annotations

import json


def test_the_default_builds_peak_memory_stays_far_below_the_machines(qwen_dir):
    manifest = json.loads((qwen_dir / "etserve.json").read_text())
    assert manifest["max_seq_len"] >= 32768
    # measured 5.8 GB (2026-11-30); 12 GB leaves room for the test suite running beside a build
    assert 0 < manifest["peak_rss_mb"] < 12_000, manifest["peak_rss_mb"]
