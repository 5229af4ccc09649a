"""Which sequence runs the next forward step: the scheduling policy, as pure logic.

The engine runs one forward call at a time (a prefill chunk or a decode step). Between two
calls, every sequence that wants the next one has a `Claim`, and `StepPolicy.pick` chooses
among them. The policy is least-attained-service in levels, with a bound on waiting:

- **Short before long.** A sequence's level grows with its size: the compute it has received
  (`service`, seconds of forward calls) or, when that is more, the compute its prompt is known
  to need (`size`: its uncached prompt tokens as `PrefillCost` prices them). Level 0 below
  `quantum`, then one level per doubling. The lowest level goes first, so a new request (an
  editor's infill, a short chat turn) gets its prefill and first tokens ahead of a long prompt
  already under way, which waits at most one of its own chunks, however early in that prompt
  the short one arrives.
- **Turns.** Within a level, decoding sequences take turns (the one whose last step is
  oldest goes first), so every stream advances; sequences still reading their prompt go in
  arrival order, and so do equal requests.
- **Nothing starves.** A claim that has waited `max_wait` seconds goes first (the longest
  waiting of those), however much service it has had: a long request keeps at least one step
  every `max_wait` seconds while short ones keep arriving.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable


@dataclass
class Claim:
    """One sequence's standing with the scheduler (kept across its steps)."""

    seq: int  # arrival number: unique, increasing
    arrival: float  # when the request arrived (clock seconds)
    service: float = 0.0  # seconds of forward calls it has had
    size: float = 0.0  # seconds of compute its prompt is known to need (an estimate, from its length)
    last_run: float | None = None  # when its last step ended; None before its first
    decoding: bool = False  # its prompt is read: it now makes tokens
    waiting_since: float = 0.0  # when it asked for the step it waits for
    label: str = field(default="", compare=False)  # for logs and tests


@dataclass(frozen=True)
class StepPolicy:
    quantum: float = 0.5  # seconds of service in level 0; each later level twice the last
    max_wait: float = 3.0  # a claim that waited this long goes next
    max_level: int = 16

    def level(self, service: float) -> int:
        if service < self.quantum:
            return 0
        return min(self.max_level, 1 + int(math.log2(service / self.quantum)))

    def key(self, c: Claim) -> tuple:
        """Sort key among claims that have not waited too long (smallest goes first)."""
        if c.decoding:
            turn = c.last_run if c.last_run is not None else c.arrival
        else:
            turn = c.arrival
        return (self.level(max(c.service, c.size)), turn, c.seq)

    def pick(self, claims: Iterable[Claim], now: float) -> Claim | None:
        claims = list(claims)
        if not claims:
            return None
        overdue = [c for c in claims if now - c.waiting_since >= self.max_wait]
        if overdue:
            return min(overdue, key=lambda c: (c.waiting_since, c.seq))
        return min(claims, key=self.key)


class PrefillCost:
    """Seconds reading `n` prompt tokens from position `start` takes, learnt from the chunks read:
    `per_token` for each token plus `per_context` for each token of context before it (attention's
    share, which grows with the position). One rate for all positions would be set by the long
    prompts (a 12k context's chunks cost several times a short one's): a 100-token chat turn would
    then look as long as the quantum and wait behind every stream until they had each had that much
    service (up to max_wait, seconds, for a prompt read in 0.2 s). Nor do a few tokens' chunks
    count (FEWEST): per token, a call's fixed cost makes them look as slow again."""

    SHORT = 1024  # chunks whose middle is below this teach per_token; beyond it, per_context
    # chunks of fewer tokens teach nothing: a call's fixed cost (reading the weights, sampling) is
    # most of theirs (a cached prompt's last token alone takes a decode step, ~10 ms a token)
    FEWEST = 64

    def __init__(self, per_token: float = 0.002, per_context: float = 0.0, weight: float = 0.2):
        self.per_token, self.per_context, self.weight = per_token, per_context, weight

    def estimate(self, start: int, n: int) -> float:
        return n * (self.per_token + self.per_context * (start + n / 2)) if n > 0 else 0.0

    def observe(self, start: int, n: int, seconds: float) -> None:
        if n < self.FEWEST or seconds <= 0:
            return
        each, middle = seconds / n, start + n / 2
        if middle < self.SHORT:
            self.per_token += self.weight * (each - self.per_token)
        else:
            slope = max(0.0, (each - self.per_token) / middle)
            self.per_context += self.weight * (slope - self.per_context)
