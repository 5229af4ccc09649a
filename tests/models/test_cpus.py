"""The cores a build step may use (app/models/cpus.py)."""

import os

from app.models.cpus import usable_cpus


def test_the_setting_caps_the_cores_this_process_may_use(monkeypatch):
    mine = len(os.sched_getaffinity(0))
    monkeypatch.delenv("ETSERVE_TEST_CPUS", raising=False)
    assert usable_cpus("ETSERVE_TEST_CPUS") == min(mine, 2)
    assert usable_cpus("ETSERVE_TEST_CPUS", default=1) == 1
    monkeypatch.setenv("ETSERVE_TEST_CPUS", "1000")
    assert usable_cpus("ETSERVE_TEST_CPUS") == mine
    monkeypatch.setenv("ETSERVE_TEST_CPUS", "0")
    assert usable_cpus("ETSERVE_TEST_CPUS") == 1
