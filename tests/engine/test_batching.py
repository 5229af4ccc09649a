"""Decode steps sharing a forward call (app/engine/batching.py), as pure logic: which jobs go
into one call, the rows they make, and how a job's rows are verified."""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.batching import DecodeJob, choose_batch, grammar_drafts, rows_of, verify
from app.engine.scheduler import Claim


@dataclass(frozen=True)
class Ev:
    token_id: int


def job(seq: int, pos: int, drafts=(), *, last_run=None, budget=100, picks=None, stop_ids=frozenset(),
        cancelled=False) -> DecodeJob:
    """A job whose row i samples picks[i] (default: agrees with every draft, then 99)."""
    drafts = list(drafts)
    picks = list(picks) if picks is not None else drafts + [99]
    seen = []

    def sample(row, emitted):
        seen.append((row, list(emitted)))
        return Ev(picks[row])

    j = DecodeJob(Claim(seq=seq, arrival=0.0, last_run=last_run), slot=seq, token=10 + seq, pos=pos,
                  drafts=drafts, budget=budget, sample=sample, cancelled=lambda: cancelled, stop_ids=stop_ids)
    j.seen = seen
    return j


def test_the_leader_takes_waiting_jobs_along_while_rows_fit():
    leader = job(1, 50, [1, 2, 3])  # 4 rows
    a, b, c = job(2, 10, last_run=1.0), job(3, 20, [5, 6], last_run=0.5), job(4, 30, [7] * 6, last_run=2.0)
    batch = choose_batch(leader, [a, b, c], max_rows=16, context_length=1000)
    # everything fits (15 rows); lowest position first
    assert batch == [a, b, c, leader]
    assert [j.drafts for j in batch] == [[], [5, 6], [7] * 6, [1, 2, 3]]


def test_long_drafts_are_cut_so_that_waiting_jobs_go_along():
    leader = job(1, 50, [1, 2, 3])  # 4 rows
    a, b, c = job(2, 10, last_run=1.0), job(3, 20, [5, 6], last_run=0.5), job(4, 30, [7] * 6, last_run=2.0)
    batch = choose_batch(leader, [a, b, c], max_rows=8, context_length=1000)
    # 15 rows for 8: every job goes along; the longest drafts are cut first, down to a level
    assert batch == [a, b, c, leader]
    assert sum(j.rows for j in batch) == 8
    assert [j.drafts for j in batch] == [[], [5], [7], [1, 2]]  # at a tie the riders are cut first
    # more jobs than rows: the oldest-waiting first, drafts cut to nothing
    jobs = [job(10 + i, i, [1, 2, 3], last_run=float(i)) for i in range(5)]
    batch = choose_batch(jobs[4], jobs[:4], max_rows=3, context_length=1000)
    assert batch == [jobs[0], jobs[1], jobs[4]] and all(not j.drafts for j in batch)
    # a lone leader keeps its drafts up to the rows
    lone = job(20, 0, list(range(40)))
    assert choose_batch(lone, [], max_rows=32, context_length=1000) == [lone] and lone.rows == 32


def test_cancelled_jobs_do_not_go_along():
    leader = job(1, 5)
    gone = job(2, 6, cancelled=True)
    assert choose_batch(leader, [gone], max_rows=8, context_length=100) == [leader]


def test_the_first_rows_position_leaves_room_for_all_rows():
    # the program checks row 0's position + the rows against the cache: a job near the end of the
    # context with a low-position leader would not fit after it
    leader = job(1, 95, [1, 2])  # positions 95..97
    low = job(2, 90, [3, 4, 5])  # 90..93: 90 + 7 rows = 97 <= 100, fits
    assert choose_batch(leader, [low], max_rows=16, context_length=100) == [low, leader]
    assert choose_batch(leader, [low], max_rows=16, context_length=96) == [leader]  # 90 + 7 > 96: dropped


def test_rows_of_a_batch():
    a, b = job(1, 7, [100, 101]), job(2, 3)
    tokens, positions, slots = rows_of([a, b])
    assert tokens == [11, 100, 101, 12]
    assert positions == [7, 8, 9, 3]
    assert slots == [1, 1, 1, 2]


def test_verify_accepts_drafts_until_the_model_disagrees():
    j = job(1, 0, [5, 6, 7, 8], picks=[5, 6, 9, 8, 1])
    used = []
    verify(j, 3, used.append)
    assert [e.token_id for e in j.events] == [5, 6, 9]  # two accepted, then the model's own token
    assert j.accepted == 2
    assert used == [3, 4, 5]  # rows past the first mismatch are never sampled
    assert j.seen == [(0, []), (1, [5]), (2, [5, 6])]  # each row sees the tokens before it


def test_verify_all_accepted_gives_one_more_token():
    j = job(1, 0, [5, 6], picks=[5, 6, 42])
    verify(j, 0, lambda r: None)
    assert [e.token_id for e in j.events] == [5, 6, 42] and j.accepted == 2


def test_verify_stops_at_a_stop_token_and_at_the_budget():
    j = job(1, 0, [5, 2, 7], picks=[5, 2, 7, 8], stop_ids=frozenset({2}))
    verify(j, 0, lambda r: None)
    assert [e.token_id for e in j.events] == [5, 2]
    j = job(1, 0, [5, 6, 7], picks=[5, 6, 7, 8], budget=2)
    verify(j, 0, lambda r: None)
    assert [e.token_id for e in j.events] == [5, 6]


def test_verify_without_drafts_samples_one_row():
    j = job(1, 0, [], picks=[3])
    verify(j, 0, None)
    assert [e.token_id for e in j.events] == [3] and j.accepted == 0


class FakeGrammar:
    def __init__(self, takes: int, forced: list[int]):
        self.takes, self._forced = takes, forced

    def valid_prefix(self, tokens):
        return min(self.takes, len(tokens))

    def forced(self):
        return list(self._forced)


def test_grammar_drafts_cut_refused_tokens_or_take_the_forced_ones():
    # the grammar takes 2 of 5 looked-up drafts, forces nothing: the 2
    assert grammar_drafts(FakeGrammar(2, []), [1, 2, 3, 4, 5], 10) == ([1, 2], True)
    # it forces 3 tokens: longer than what it takes of the lookup, so those (within the limit)
    assert grammar_drafts(FakeGrammar(2, [7, 8, 9]), [1, 2, 3, 4, 5], 10) == ([7, 8, 9], False)
    assert grammar_drafts(FakeGrammar(2, [7, 8, 9]), [1, 2, 3, 4, 5], 2) == ([1, 2], True)
    assert grammar_drafts(FakeGrammar(0, [7]), [], 10) == ([7], False)
    assert grammar_drafts(FakeGrammar(0, [7]), [], 0) == ([], True)
    # a constraint without the optional methods: the drafts as they are
    assert grammar_drafts(object(), [1, 2], 10) == ([1, 2], True)
