"""app/router/policy.py: which loaded models give way to another (pure logic)."""

import pytest

from app.router.policy import Loaded, WontFit, evictions

MB = 2**20


def m(name, size=100, busy=0, last_used=0.0):
    return Loaded(name, size * MB, busy, last_used)


def test_room_already_means_nothing_goes():
    assert evictions([], 100 * MB, max_models=1) == []
    assert evictions([m("a")], 100 * MB, max_models=2) == []


def test_the_least_recently_used_idle_model_goes_first():
    loaded = [m("a", last_used=5), m("b", last_used=1), m("c", last_used=3)]
    assert evictions(loaded, 100 * MB, max_models=3) == ["b"]
    assert evictions(loaded, 100 * MB, max_models=2) == ["b", "c"]
    assert evictions(loaded, 100 * MB, max_models=1) == ["b", "c", "a"]


def test_a_busy_model_is_skipped_and_none_means_wait():
    loaded = [m("a", busy=1, last_used=0), m("b", last_used=9)]
    assert evictions(loaded, 100 * MB, max_models=2) == ["b"]  # a is older, but busy
    assert evictions(loaded, 100 * MB, max_models=1) is None  # only a's going would do
    assert evictions([m("a", busy=2)], 100 * MB, max_models=1) is None


def test_the_memory_cap_takes_as_few_as_fit():
    loaded = [m("small", size=100, last_used=1), m("big", size=700, last_used=2)]
    # 800 used + 400 > 1000: the older (small) goes first, and that is not enough
    assert evictions(loaded, 400 * MB, max_models=4, max_bytes=1000 * MB) == ["small", "big"]
    assert evictions(loaded, 250 * MB, max_models=4, max_bytes=1000 * MB) == ["small"]
    assert evictions(loaded, 200 * MB, max_models=4, max_bytes=1000 * MB) == []  # exactly at the cap
    assert evictions(loaded, 200 * MB, max_models=4, max_bytes=0) == []  # no cap


def test_a_model_larger_than_the_cap_never_fits():
    with pytest.raises(WontFit):
        evictions([], 2000 * MB, max_models=4, max_bytes=1000 * MB)


def test_max_models_below_one_is_refused():
    with pytest.raises(ValueError):
        evictions([], 1, max_models=0)
