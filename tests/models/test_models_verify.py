"""Fidelity of an already built SmolLM2 .pte against transformers (slow: set ETSERVE_SLOW_TESTS=1)."""

from __future__ import annotations

import io
import os

import pytest

from app.models.build import read_manifest
from app.models.registry import model_dir, resolve_options

pytestmark = pytest.mark.skipif(os.environ.get("ETSERVE_SLOW_TESTS") != "1", reason="set ETSERVE_SLOW_TESTS=1")


@pytest.mark.parametrize("custom_ops", [False, True])
def test_smollm2_512_matches_transformers(custom_ops):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    directory = model_dir("smollm2-135m", resolve_options("smollm2-135m", 512, "none", custom_ops))
    if read_manifest(directory) is None:
        pytest.skip(f"not built: {directory}")
    from app.models.verify import verify

    report = verify("smollm2-135m", directory, new_tokens=8, stream=io.StringIO())
    assert report["metadata"]["get_max_seq_len"] == 512
    assert report["max_abs_diff"] < 1e-3
    assert report["greedy_match"]
