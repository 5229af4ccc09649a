"""The scheduling policy and the step gate, as pure logic on a fake clock (no model)."""

from __future__ import annotations

import threading
import time

from app.engine.scheduler import Claim, StepPolicy
from app.engine.steps import StepGate


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def claim(seq, arrival=0.0, service=0.0, decoding=False, last_run=None, waiting_since=None):
    return Claim(seq=seq, arrival=arrival, service=service, decoding=decoding, last_run=last_run,
                 waiting_since=arrival if waiting_since is None else waiting_since)


def test_levels_double():
    p = StepPolicy(quantum=0.5)
    assert [p.level(s) for s in (0, 0.49, 0.5, 0.99, 1.0, 2.0, 4.0, 1000.0)] == [0, 0, 1, 1, 2, 3, 4, 11]


def test_a_new_short_request_goes_before_a_long_prefill_under_way():
    p = StepPolicy()
    long = claim(1, arrival=0.0, service=20.0, waiting_since=20.0)  # 20 s into its prompt
    short = claim(2, arrival=19.9, waiting_since=19.9)
    assert p.pick([long, short], now=20.0) is short


def test_equal_requests_go_in_arrival_order():
    p = StepPolicy()
    a, b, c = claim(1, arrival=1.0), claim(2, arrival=2.0), claim(3, arrival=3.0)
    assert p.pick([c, b, a], now=3.0) is a
    # prompts being read: the earlier one keeps going first while both are in the same level
    a.service, b.service = 0.3, 0.0
    assert p.pick([b, a], now=3.1) is a


def test_decoders_take_turns():
    p = StepPolicy()
    a = claim(1, arrival=0.0, service=1.0, decoding=True, last_run=5.00, waiting_since=5.0)
    b = claim(2, arrival=0.1, service=1.0, decoding=True, last_run=5.02, waiting_since=5.0)
    c = claim(3, arrival=0.2, service=1.0, decoding=True, last_run=5.01, waiting_since=5.0)
    order = []
    now = 5.03
    for _ in range(6):
        nxt = p.pick([a, b, c], now)
        order.append(nxt.seq)
        nxt.last_run = nxt.waiting_since = now = now + 0.02
    assert order == [1, 3, 2, 1, 3, 2]


def test_a_claim_waiting_too_long_goes_first_whatever_its_service():
    p = StepPolicy(max_wait=3.0)
    long = claim(1, arrival=0.0, service=50.0, waiting_since=10.0)
    fresh = claim(2, arrival=12.9, waiting_since=12.9)
    assert p.pick([long, fresh], now=12.9) is fresh
    assert p.pick([long, fresh], now=13.0) is long  # waited 3 s


def simulate(policy, jobs, until=1e9, step_s=lambda c: 0.1):
    """A discrete run of the policy: jobs = [(arrival, steps, label)]; returns {label: finish time}
    and the order of steps. A single sequence runs its steps back to back (the gate)."""
    clock = 0.0
    pending = sorted(jobs)
    live: dict[int, list] = {}  # seq -> [claim, steps left]
    finished, order = {}, []
    seq = 0
    while (pending or live) and clock < until:
        while pending and pending[0][0] <= clock:
            arrival, steps, label = pending.pop(0)
            seq += 1
            c = Claim(seq=seq, arrival=arrival, waiting_since=arrival, label=label)
            live[seq] = [c, steps]
        if not live:
            clock = pending[0][0]
            continue
        c = policy.pick([v[0] for v in live.values()], clock)
        d = step_s(c)
        clock += d
        c.service += d
        c.last_run = clock
        order.append(c.label)
        live[c.seq][1] -= 1
        if live[c.seq][1] == 0:
            finished[c.label] = clock
            del live[c.seq]
        c.waiting_since = clock
        c.decoding = True
    return finished, order


def test_an_infill_during_a_long_prompt_finishes_first_and_the_long_one_barely_waits():
    """An editor's infill (10 prefill + 32 decode steps of ~17 ms) arrives 5 s into an agent's
    12k-token prompt (100 chunks of 0.3 s): it is done within ~1 s of arriving, and the agent
    ends no later than its own time plus the infill's compute."""
    p = StepPolicy()

    def cost(c):
        return 0.3 if c.label == "agent" else (0.1 if c.service < 1.0 and not c.decoding else 0.017)

    finished, _ = simulate(p, [(0.0, 100, "agent"), (5.0, 42, "infill")], step_s=cost)
    assert finished["infill"] - 5.0 < 1.5
    alone, _ = simulate(p, [(0.0, 100, "agent")], step_s=cost)
    assert finished["agent"] <= alone["agent"] + 1.5


def test_nothing_starves_while_short_requests_arrive_back_to_back():
    """Short requests (4 steps) arrive as fast as they are served: each stays in level 0, so
    least-attained-service alone would never run the long one again; the bound on waiting does."""
    jobs = [(0.0, 50, "long")] + [(0.4 * i, 4, f"short{i}") for i in range(1, 1000)]
    starved, _ = simulate(StepPolicy(max_wait=1e9), jobs, until=400, step_s=lambda c: 0.1)
    assert "long" not in starved  # what the bound is for
    finished, order = simulate(StepPolicy(max_wait=3.0), jobs, until=400, step_s=lambda c: 0.1)
    assert "long" in finished
    # from the end of one of its steps to the end of the next: at most max_wait, the step under
    # way when it became overdue, and its own
    runs = [i for i, label in enumerate(order) if label == "long"]
    assert max(b - a for a, b in zip(runs, runs[1:])) * 0.1 <= 3.0 + 0.2 + 1e-9


def _waiting_acquire(gate, claim, got):
    t = threading.Thread(target=lambda: got.append((claim.seq, gate.acquire(claim))))
    before = gate.waiting
    t.start()
    while gate.waiting != before + 1:
        time.sleep(0.001)
    return t


def test_gate_goes_to_the_policys_pick_among_the_waiters_and_the_releaser():
    clock = Clock()
    gate = StepGate(StepPolicy(), clock)
    a, b = claim(1, arrival=0.0), claim(2, arrival=0.5)
    got = []
    assert gate.acquire(a)
    t = _waiting_acquire(gate, b, got)
    clock.t = 1.0
    gate.release(a, 1.0)  # a has had a second of service, b none: handed over to b
    t.join(5)
    assert got == [(2, True)] and gate.holder is b and a.service == 1.0 and gate.handovers == 1
    # a asks while b holds it; b releases after a short step: b (less service) is still the
    # policy's pick, so the gate is kept for b, not handed to a
    t = _waiting_acquire(gate, a, got)
    clock.t = 1.1
    gate.release(b, 0.1)
    assert gate.holder is None and gate.kept == 1 and gate.waiting == 1
    assert gate.acquire(b) and gate.holder is b  # b's next step: at once, ahead of a
    gate.release(b, 0.1)
    gate.done(b)  # b has no more steps: what was kept for it goes to a now
    t.join(5)
    assert got[-1] == (1, True) and gate.holder is a and gate.handovers == 2


def test_a_kept_step_lapses_when_its_sequence_does_not_come_back():
    """The releaser's client reads slowly: after the grace period, the waiters' pick goes."""
    gate = StepGate(StepPolicy(), grace=0.05)
    long = claim(1, arrival=0.0)
    short = claim(2, arrival=0.0)
    assert gate.acquire(long)
    got = []
    gate.release(long, 30.0)  # nobody waits: simply free
    assert gate.acquire(short)
    t = _waiting_acquire(gate, long, got)
    started = time.monotonic()
    gate.release(short, 0.01)  # kept for short (less service) ...
    assert gate.kept == 1
    t.join(5)  # ... which never asks again: long gets it once the grace is over
    assert got == [(1, True)] and gate.holder is long and 0.04 < time.monotonic() - started < 1.0


def test_a_dropped_waiter_leaves_at_once():
    gate = StepGate(StepPolicy(), Clock())
    a, b = claim(1), claim(2)
    assert gate.acquire(a)
    got = []
    t = threading.Thread(target=lambda: got.append(gate.acquire(b)))
    t.start()
    while gate.waiting != 1:
        time.sleep(0.001)
    started = time.monotonic()
    gate.drop(b)
    t.join(5)
    assert got == [False] and time.monotonic() - started < gate._POLL_S
    gate.release(a, 0.1)
    assert gate.holder is None


def test_run_if_free_runs_only_on_a_free_gate_and_never_waits():
    """A finished request's memory work (Engine._fit_memory) runs at once if no step runs, else
    not at all (the next step does it): never a wait, never a step counted."""
    gate = StepGate(StepPolicy(), Clock())
    a, b, c = claim(1), claim(2), claim(3)
    ran = []
    assert gate.run_if_free(a, lambda: ran.append(gate.holder))
    assert ran == [a] and gate.holder is None and gate.steps == 0
    assert gate.acquire(b)
    assert not gate.run_if_free(a, lambda: ran.append("held"))  # b's step runs: not now
    got = []
    t = _waiting_acquire(gate, c, got)
    gate.release(b, 0.1)  # kept for b (the policy's pick): free, but not for a
    assert gate.holder is None and gate.kept == 1
    assert not gate.run_if_free(a, lambda: ran.append("kept for b"))
    gate.done(b)  # b has no more steps: c's turn
    t.join(5)
    assert got == [(3, True)] and gate.holder is c
    assert not gate.run_if_free(a, lambda: ran.append("c holds it"))
    gate.release(c, 0.1)
    assert gate.run_if_free(c, lambda: ran.append("free"))
    assert ran == [a, "free"] and gate.holder is None


def test_prefill_steps_shrink_to_fit_the_step_time():
    from types import SimpleNamespace

    from app.engine import Engine

    info = SimpleNamespace(max_seq_len=4096, max_prefill_len=512, vocab_size=10, eos_ids=(), bos_id=None)
    engine = Engine(SimpleNamespace(info=info), prefill_chunk=128, prefill_step_s=0.5)
    assert engine._chunk_size(None) == 128  # nothing measured yet
    assert engine._chunk_size(0.001) == 128  # 128 tokens in 0.13 s: fits
    assert engine._chunk_size(0.013) == 32  # a long context on a slow CPU: 0.5 s / 14.3 ms, to 16s
    assert engine._chunk_size(1.0) == 16  # never fewer than 16
    engine.prefill_step_s = 0
    assert engine._chunk_size(1.0) == 128


def test_a_short_request_early_in_a_long_prompt_still_goes_first_by_size():
    """The infill arrives 1 s into a 30-second prompt: by service alone the long one (1 s) would
    be level with it; by the size its prompt is known to have, it waits."""
    p = StepPolicy()
    long = claim(1, arrival=0.0, service=1.0, waiting_since=1.0)
    long.size = 30.0
    short = claim(2, arrival=1.0, service=1.5, decoding=True, last_run=1.5, waiting_since=1.5)
    short.size = 1.2
    assert p.pick([long, short], now=1.6) is short
    long.size = 0.0  # without it: the long one, with less service, would go
    assert p.pick([long, short], now=1.6) is long


def test_prefill_cost_prices_a_short_prompt_by_short_chunks_however_long_the_others_were():
    """Chunks of 12k-token prompts cost several times a short one's per token (attention over the
    context): priced at one moving rate, a 110-token chat turn looked like 0.55 s, level 1, and
    waited behind four streams for up to max_wait (3 s, measured) on idle slots."""
    from app.engine.scheduler import PrefillCost

    def seconds(start, n):  # 1.5 ms a token, plus 0.3 us per token of context before it
        return n * (0.0015 + 3e-7 * (start + n / 2))

    cost = PrefillCost()
    for _ in range(3):  # a few long prompts read, in 128-token chunks
        for start in range(0, 12000, 128):
            cost.observe(start, 128, seconds(start, 128))
    short = cost.estimate(0, 110)
    assert abs(short - seconds(0, 110)) < 0.2 * seconds(0, 110)
    assert StepPolicy().level(short) == 0
    assert abs(cost.estimate(0, 12000) - 12000 * 0.0033) < 0.2 * 12000 * 0.0033  # long ones stay long
    assert abs(cost.estimate(10000, 500) - seconds(10000, 500)) < 0.2 * seconds(10000, 500)  # late in a long context

    one_rate = 0.002  # the old estimate: one moving average of every chunk's per-token time
    for start in range(0, 12000, 128):
        one_rate += 0.2 * (seconds(start, 128) / 128 - one_rate)
    assert StepPolicy().level(110 * one_rate) == 1


def test_a_short_newcomer_goes_before_streams_that_have_had_little_service():
    p = StepPolicy()
    streams = [claim(i, arrival=0.0, service=0.3, decoding=True, last_run=1.0 + i / 100, waiting_since=1.0)
               for i in range(1, 5)]
    new = claim(9, arrival=0.99, waiting_since=0.99)
    new.size = 0.17  # 110 tokens, priced by PrefillCost
    assert p.pick(streams + [new], now=1.05) is new
    new.size = 0.55  # priced at the long prompts' rate: level 1, behind every stream
    assert p.pick(streams + [new], now=1.05) is not new


def test_prefill_cost_learns_nothing_from_a_few_tokens_chunk():
    """A cached prompt's last token is read alone, in a call that costs what a decode step does
    (~13 ms): counted per token, it made every prompt look 5-10 times as long."""
    from app.engine.scheduler import PrefillCost

    cost = PrefillCost()
    for _ in range(20):
        cost.observe(0, 128, 0.19)  # 1.5 ms a token
        cost.observe(115, 1, 0.013)
        cost.observe(3000, 3, 0.015)
    assert abs(cost.estimate(0, 110) - 0.165) < 0.01
