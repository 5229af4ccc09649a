"""The step gate: one forward step at a time, handed to the claim the policy picks.

A sequence calls `acquire(claim)` before each forward call (a prefill chunk or a decode step)
and `release(claim, seconds)` after it; `done(claim)` when it has no more steps. While the gate
is free and nobody waits, an arriving claim takes it at once. Otherwise each release chooses,
with `StepPolicy.pick`, among the claims waiting *and the releaser itself*, which will ask again
in a moment (it yields its token first):

- a waiter picked gets the gate handed straight over;
- the releaser picked keeps it reserved for `grace` seconds: its next `acquire` takes it at
  once. Without this, a sequence that releases is never in line at the moment of choosing, so
  two sequences would alternate step for step whatever the policy says (a short request could
  not go before a long prompt). If the releaser does not come back in time (its client reads
  slowly), the reservation lapses and the waiters' pick goes.

Under gevent, threading is monkey-patched and the events are gevent's.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from .scheduler import Claim, StepPolicy


class StepGate:
    _POLL_S = 0.25  # how often a waiter checks whether its client left

    def __init__(self, policy: StepPolicy | None = None, clock: Callable[[], float] = time.monotonic,
                 grace: float = 0.02):
        self.policy = policy or StepPolicy()
        self.clock = clock
        self.grace = grace  # seconds the gate stays reserved for a releaser the policy picked
        self._mutex = threading.Lock()
        self._held: Claim | None = None
        self._reserved: tuple[Claim, float] | None = None  # (claim, until): free, but kept for it
        self._waiting: dict[int, tuple[Claim, threading.Event]] = {}
        self._last: Claim | None = None  # the claim whose step ran last
        self.steps = 0
        self.handovers = 0  # steps handed to another sequence than the one that ran the last
        self.kept = 0  # steps a releaser kept the gate for (the policy preferred it to the waiters)
        self.shared = 0  # steps that went along in another sequence's forward call (batched decode)

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
            claim.waiting_since = now = self.clock()
            if self._held is None:
                reserved = self._reserved
                if reserved is not None and reserved[0] is claim:
                    self._reserved = None
                    self._held = claim
                    return True
                if (reserved is None or reserved[1] <= now) and not self._waiting:
                    self._reserved = None
                    self._held = claim
                    return True
            turn = threading.Event()
            self._waiting[claim.seq] = (claim, turn)
            self._grant_if_free(now)
        while True:
            with self._mutex:
                timeout = self._POLL_S
                if self._reserved is not None:
                    timeout = min(timeout, max(0.0, self._reserved[1] - self.clock()) + 0.001)
            if turn.wait(timeout):
                break
            with self._mutex:
                if turn.is_set():
                    break
                self._grant_if_free(self.clock())  # a reservation lapsed: the waiters' pick goes
                if turn.is_set():
                    break
            if gave_up():
                with self._mutex:
                    if not turn.is_set():
                        self._waiting.pop(claim.seq, None)
                        return False
                break  # handed over meanwhile: ours
        with self._mutex:
            return self._held is claim

    def run_if_free(self, claim: Claim, fn: Callable[[], None]) -> bool:
        """Run `fn` holding the gate if it is free and nobody waits for it (or it is reserved for
        `claim`), without waiting and without counting a step; False if it was not free."""
        with self._mutex:
            now = self.clock()
            reserved = self._reserved
            mine = reserved is not None and reserved[0] is claim
            if self._held is not None or not (mine or ((reserved is None or reserved[1] <= now) and not self._waiting)):
                return False
            self._reserved = None
            self._held = claim
        try:
            fn()
        finally:
            with self._mutex:
                self._held = None
                self._grant_if_free(self.clock())
        return True

    def _grant_if_free(self, now: float) -> None:
        """(mutex held) A free gate whose reservation, if any, has lapsed goes to the waiters' pick."""
        if self._held is not None or not self._waiting:
            return
        if self._reserved is not None and self._reserved[1] > now:
            return
        self._reserved = None
        self._hand_to(self.policy.pick((c for c, _ in self._waiting.values()), now))

    def _hand_to(self, nxt: Claim) -> None:
        _, turn = self._waiting.pop(nxt.seq)
        if self._last is not None and nxt is not self._last:
            self.handovers += 1
        self._held = nxt
        turn.set()

    def drop(self, claim: Claim) -> None:
        """Take a claim out of line at once (its request was cancelled): its acquire returns
        False without waiting for its next poll; a reservation for it lapses."""
        with self._mutex:
            entry = self._waiting.pop(claim.seq, None)
            if self._reserved is not None and self._reserved[0] is claim:
                self._reserved = None
                self._grant_if_free(self.clock())
        if entry is not None:
            entry[1].set()

    def release(self, claim: Claim, seconds: float) -> None:
        """The step of `claim` took `seconds`: the gate goes to the claim the policy picks among
        those waiting and the releaser (see the module's docstring)."""
        now = self.clock()
        with self._mutex:
            if self._held is not claim:
                raise RuntimeError("release of a step gate not held by this claim")
            claim.service += max(0.0, seconds)
            claim.last_run = now
            claim.waiting_since = now  # as if it asked again right away
            self.steps += 1
            self._last = claim
            self._held = None
            self._reserved = None
            if not self._waiting:
                return
            nxt = self.policy.pick([c for c, _ in self._waiting.values()] + [claim], now)
            if nxt is claim:
                self._reserved = (claim, now + self.grace)
                self.kept += 1
                return
            self._hand_to(nxt)

    def take_along(self, claims: list[Claim], mark: Callable[[Claim], None]) -> list[Claim]:
        """(By the holder) Take these claims out of line, as their steps go into the holder's forward
        call (batched decode): `mark(claim)` runs for each under the gate's lock, before its
        `acquire` returns False. Returns those that were waiting (only they go along)."""
        taken = []
        with self._mutex:
            for c in claims:
                entry = self._waiting.pop(c.seq, None)
                if entry is not None:
                    mark(c)
                    taken.append((c, entry[1]))
        for _, turn in taken:
            turn.set()
        return [c for c, _ in taken]

    def credit(self, claims: list[Claim], seconds: float) -> None:
        """Claims taken along had a step of `seconds` (their share of the call)."""
        now = self.clock()
        with self._mutex:
            for c in claims:
                c.service += max(0.0, seconds)
                c.last_run = now
                c.waiting_since = now
                self.shared += 1

    def done(self, claim: Claim) -> None:
        """The claim has no more steps: a reservation for it goes to the waiters now."""
        with self._mutex:
            if self._reserved is not None and self._reserved[0] is claim:
                self._reserved = None
                self._grant_if_free(self.clock())
