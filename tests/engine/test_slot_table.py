"""Which slot a request takes, and the line for slots (pure logic, no model)."""

from __future__ import annotations

import threading
import time

from app.engine.slots import Slot, SlotTable


def slot(i, tokens=(), owner=None, last_used=0.0):
    return Slot(i, tokens=list(tokens), owner=owner, last_used=last_used)


def test_the_sessions_own_slot_first():
    free = [slot(0, [1, 2, 3], last_used=5), slot(1, [9, 9], owner="s")]
    assert SlotTable.best(free, [1, 2, 3, 4], "s").index == 1


def test_a_slot_whose_contents_the_prompt_continues():
    free = [slot(0, [1, 2, 3, 4, 5, 6]), slot(1, [1, 2, 3, 7], last_used=1), slot(2)]
    assert SlotTable.best(free, [1, 2, 3, 4, 5, 6, 7, 8], None).index == 0
    assert SlotTable.best(free, [1, 2, 3, 7, 8], None).index == 1


def test_a_short_shared_prefix_does_not_cost_another_conversation_its_slot():
    """A system prompt in common (3 of 10 tokens) is no reason to overwrite a conversation: the
    empty slot is taken, and the prefix is copied there instead."""
    free = [slot(0, [1, 2, 3, 10, 11, 12, 13, 14, 15, 16], last_used=9), slot(1)]
    assert SlotTable.best(free, [1, 2, 3, 20, 21], None).index == 1
    # with no empty slot: the least recently used goes
    free = [slot(0, [1, 2, 3, 10, 11, 12, 13, 14, 15, 16], last_used=9), slot(1, [5, 6], last_used=2)]
    assert SlotTable.best(free, [1, 2, 3, 20, 21], None).index == 1


def test_slots_go_to_waiters_in_arrival_order_and_a_departed_waiter_leaves():
    table = SlotTable(1)
    first = table.acquire([1, 2], None, lambda: False, 10)
    assert first.busy and table.busy == 1
    got, gone = [], threading.Event()

    def wait(name, gave_up=lambda: False):
        got.append((name, table.acquire([len(got)], None, gave_up, 10)))

    threads = []
    for name, gave_up in ((0, None), (1, None), ("left", gone.is_set), (2, None)):
        threads.append(threading.Thread(target=wait, args=(name,) + ((gave_up,) if gave_up else ())))
        threads[-1].start()
        while table.waiting < len(threads):
            time.sleep(0.001)
    gone.set()
    threads[2].join(5)
    assert got == [("left", False)] and table.waiting == 3
    for n in range(3):
        table.release(first)
        while len(got) < n + 2:
            time.sleep(0.001)
        assert got[-1] == (n, first) and first.busy
    assert table.waiting == 0


def test_a_waiter_times_out():
    table = SlotTable(1)
    table.acquire([1], None, lambda: False, 10)
    started = time.monotonic()
    assert table.acquire([2], None, lambda: False, 0.3) is None
    assert 0.25 < time.monotonic() - started < 2 and table.waiting == 0
