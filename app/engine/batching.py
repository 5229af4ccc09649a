"""Decode steps that share a forward call: batched decode and speculative drafts.

A decode step of a small model is bound by reading the weights: one forward over several rows
reads them once. In a rows build (the runtime's `forward_rows`) a row is a token at its own
position of its own sequence slot, so one call can carry

- the decode steps of several sequences (each a `DecodeJob` waiting for the step gate: the
  sequence that holds the gate takes the others along, `choose_batch`), and
- a sequence's draft: its next token and the k tokens guessed to follow it (drafts.py), at
  consecutive positions of its slot, verified in the same call.

`verify` samples a job's rows in order with the request's own sampler, grammar and penalties,
and accepts drafts while the sampled token is the drafted one (drafts.accept_lazily): the output
is exactly plain decoding's (byte-identical at temperature 0; the same distribution, and for a
seed the same tokens, when sampling). Rows past the first mismatch are never sampled; the KV
entries the call wrote for them lie beyond the sequence's length, where its next call writes
again before any row can attend to them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .scheduler import Claim


@dataclass(eq=False)
class DecodeJob:
    """One sequence's decode step, with the draft to verify in it (possibly none)."""

    claim: Claim
    slot: int  # its sequence slot in the runtime
    token: int  # the last token emitted, not yet in the KV cache
    pos: int  # the position it goes to
    drafts: list[int]  # guessed tokens for pos + 1 ..
    budget: int  # most tokens this step may emit (the generation's tokens left)
    sample: Callable[[int, list[int]], Any]  # (row, tokens emitted so far this step) -> TokenEvent
    cancelled: Callable[[], bool] = lambda: False
    stop_ids: frozenset[int] = frozenset()
    # filled by the step that runs it
    taken: bool = False  # a forward call carries it now (run by another sequence, or its own)
    events: list = field(default_factory=list)  # TokenEvents: the accepted drafts, then the model's token
    error: BaseException | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    @property
    def rows(self) -> int:
        return 1 + len(self.drafts)

    @property
    def accepted(self) -> int:
        """Drafts accepted: events that repeat the draft token at their place."""
        n = 0
        while n < len(self.events) and n < len(self.drafts) and self.events[n].token_id == self.drafts[n]:
            n += 1
        return n


def choose_batch(leader: DecodeJob, waiting: Sequence[DecodeJob], max_rows: int,
                 context_length: int) -> list[DecodeJob]:
    """The jobs one forward call carries: the leader's, then waiting ones (those whose last step
    is oldest first), as many as have a row each within `max_rows`. When their drafts do not all
    fit, the longest drafts are cut first (each job's `drafts` shortened in place): a sequence
    waiting for its token goes along rather than waiting behind another's long guess, and the
    first drafts of each, the likeliest to be accepted, are the ones kept. Ordered by position,
    the lowest first (the program checks the first row's position + the rows against the
    cache), and only as many as leave room for all rows after that first position."""
    batch = [leader]
    for job in sorted(waiting, key=lambda j: (j.claim.last_run or 0.0, j.claim.seq)):
        if job is leader or job.cancelled():
            continue
        if len(batch) < max_rows:
            batch.append(job)
    excess = sum(j.rows for j in batch) - max_rows
    while excess > 0:
        longest = max(batch, key=lambda j: (len(j.drafts), j is not leader))
        if not longest.drafts:
            break
        next_longest = max((len(j.drafts) for j in batch if j is not longest), default=0)
        cut = min(excess, max(1, len(longest.drafts) - next_longest))
        longest.drafts = longest.drafts[:len(longest.drafts) - cut]
        excess -= cut
    batch.sort(key=lambda j: (j.pos, j.claim.seq))
    while len(batch) > 1 and batch[0].pos + sum(j.rows for j in batch) > context_length:
        drop = batch[0] if batch[0] is not leader else batch[1]
        batch.remove(drop)
    return batch


def rows_of(batch: Sequence[DecodeJob]) -> tuple[list[int], list[int], list[int]]:
    """(tokens, positions, slots) of a rows call carrying `batch`."""
    tokens: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    for job in batch:
        tokens.append(job.token)
        tokens.extend(job.drafts)
        positions.extend(range(job.pos, job.pos + job.rows))
        slots.extend([job.slot] * job.rows)
    return tokens, positions, slots


def verify(job: DecodeJob, first_row: int, use_row: Callable[[int], None] | None) -> None:
    """Sample the job's rows in order (row first_row + i: the model after its token and
    drafts[:i]) until a sampled token differs from the draft, is a stop token, or the job's
    budget is spent; the events go to job.events. `use_row` selects a row's logits (None: a
    plain forward call's only row)."""
    events = job.events
    events.clear()
    n = len(job.drafts)
    for i in range(n + 1):
        if use_row is not None:
            use_row(first_row + i)
        event = job.sample(i, [e.token_id for e in events])
        events.append(event)
        t = event.token_id
        if i == n or t != job.drafts[i] or t in job.stop_ids or len(events) >= job.budget:
            return


def grammar_drafts(constraint, drafts: list[int], limit: int) -> tuple[list[int], bool]:
    """A constrained generation's drafts: the looked-up ones cut where the grammar would refuse
    them (a refused draft can never be accepted, and the rows after it are wasted), or the tokens
    the grammar forces from here (a schema's keys and punctuation: the mask leaves the model
    nothing else) when those are longer. Returns (drafts, whether they are the looked-up ones).
    The grammar state is the one after the step's own token: drafts follow it."""
    if not hasattr(constraint, "valid_prefix"):
        return drafts, True
    valid = drafts[:constraint.valid_prefix(drafts)] if drafts else []
    forced = constraint.forced()[:max(0, limit)] if hasattr(constraint, "forced") else []
    if len(forced) > len(valid):
        return forced, False
    return valid, True
