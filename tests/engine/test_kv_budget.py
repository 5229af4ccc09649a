"""The KV memory budget's policy (app/engine/kv_budget.py `plan`), on plain slots; the runtime's
side (ets_kv_slot_trim) in tests/engine/test_slot_memory.py, the server's in
tests/e2e/test_kv_budget.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.engine.kv_budget import Trim, plan

BPP = 1000  # bytes a position


@dataclass
class S:
    index: int
    n: int  # tokens it holds
    last_used: float
    busy: bool = False
    owner: str | None = None
    tokens: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.tokens = list(range(self.n))


def resident(*slots: S) -> dict[int, int]:
    return {s.index: s.n * BPP for s in slots}


def test_within_the_budget_nothing_is_cut():
    slots = [S(0, 500, 1.0), S(1, 400, 2.0)]
    assert plan(slots, resident(*slots), 900 * BPP, BPP) == []


def test_the_least_recently_used_idle_slot_is_cut_from_its_end_as_little_as_needed():
    slots = [S(0, 1000, 5.0), S(1, 1000, 1.0), S(2, 1000, 3.0)]
    # 3,000 positions held, 2,500 allowed: the oldest (slot 1) gives back 500 and keeps its start
    assert plan(slots, resident(*slots), 2500 * BPP, BPP) == [Trim(1, 448)]  # whole blocks of 64


def test_cuts_go_on_to_the_next_slot_when_one_is_not_enough():
    slots = [S(0, 1000, 5.0), S(1, 300, 1.0), S(2, 1000, 3.0)]
    assert plan(slots, resident(*slots), 1200 * BPP, BPP) == [Trim(1, 0), Trim(2, 192)]


def test_busy_slots_are_never_cut_even_past_the_budget():
    slots = [S(0, 4000, 1.0, busy=True), S(1, 4000, 2.0, busy=True), S(2, 100, 3.0)]
    assert plan(slots, resident(*slots), 1000 * BPP, BPP) == [Trim(2, 0)]


def test_anonymous_slots_go_before_a_sessions_own():
    slots = [S(0, 1000, 1.0, owner="s1"), S(1, 1000, 9.0)]
    assert plan(slots, resident(*slots), 1000 * BPP, BPP) == [Trim(1, 0)]


def test_memory_past_what_a_slot_holds_is_counted_and_cut_first():
    # slot 1 holds 100 tokens but 900 positions are resident (a longer prompt before)
    slots = [S(0, 1000, 5.0), S(1, 100, 1.0)]
    out = plan(slots, {0: 1000 * BPP, 1: 900 * BPP}, 1200 * BPP, BPP)
    assert out == [Trim(1, 64)]


def test_a_budget_of_zero_empties_every_idle_slot():
    slots = [S(0, 10, 1.0), S(1, 5000, 2.0), S(2, 7, 3.0, busy=True)]
    assert plan(slots, resident(*slots), 0, BPP) == [Trim(0, 0), Trim(1, 0)]
