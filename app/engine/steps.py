"""The step gate: one forward step at a time, handed to the claim the policy picks.

A sequence calls `acquire(claim)` before each forward call (a prefill chunk or a decode step)
and `release(claim, seconds)` after it. While the gate is free, an arriving claim takes it at
once; while it is held, claims wait, and each release hands the gate straight to the one that
`StepPolicy.pick` chooses among those waiting (so a sequence that just released and asks
again cannot barge ahead of one the policy prefers). Under gevent, threading is
monkey-patched and the events are gevent's.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from .scheduler import Claim, StepPolicy


class StepGate:
    _POLL_S = 0.25  # how often a waiter checks whether its client left

    def __init__(self, policy: StepPolicy | None = None, clock: Callable[[], float] = time.monotonic):
        self.policy = policy or StepPolicy()
        self.clock = clock
        self._mutex = threading.Lock()
        self._held: Claim | None = None
        self._waiting: dict[int, tuple[Claim, threading.Event]] = {}
        self.steps = 0
        self.handovers = 0  # releases that handed the gate to another sequence than the releaser

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def holder(self) -> Claim | None:
        return self._held

    def acquire(self, claim: Claim, gave_up: Callable[[], bool] = lambda: False) -> bool:
        """Wait for the step; False (and out of line) if `gave_up()` turned true meanwhile, or
        `drop` took the claim out of line."""
        with self._mutex:
            claim.waiting_since = self.clock()
            if self._held is None and not self._waiting:
                self._held = claim
                return True
            turn = threading.Event()
            self._waiting[claim.seq] = (claim, turn)
        while not turn.wait(self._POLL_S):
            if gave_up():
                with self._mutex:
                    if not turn.is_set():
                        del self._waiting[claim.seq]
                        return False
                break  # handed over meanwhile: ours
        with self._mutex:
            return self._held is claim

    def drop(self, claim: Claim) -> None:
        """Take a waiting claim out of line at once (its request was cancelled): its acquire
        returns False without waiting for its next poll."""
        with self._mutex:
            entry = self._waiting.pop(claim.seq, None)
        if entry is not None:
            entry[1].set()

    def release(self, claim: Claim, seconds: float) -> None:
        """The step of `claim` took `seconds`; the gate goes to the next claim the policy picks."""
        now = self.clock()
        with self._mutex:
            claim.service += max(0.0, seconds)
            claim.last_run = now
            self.steps += 1
            if self._held is not claim:
                raise RuntimeError("release of a step gate not held by this claim")
            nxt = self.policy.pick((c for c, _ in self._waiting.values()), now)
            if nxt is None:
                self._held = None
                return
            _, turn = self._waiting.pop(nxt.seq)
            self._held = nxt
            if nxt.seq != claim.seq:
                self.handovers += 1
            turn.set()

    def abandon(self, claim: Claim) -> None:
        """Release without a step (the holder found it had nothing to run)."""
        self.release(claim, 0.0)
