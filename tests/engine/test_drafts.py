"""Speculative drafts as pure logic: the n-gram drafter, the shared store, the draft-length
controller and the acceptance rule (no model)."""

from __future__ import annotations

import random
import re

import pytest

from app.engine.drafts import (DraftController, Drafter, PromptLookup, StepCosts, SuffixStore, accept,
                               accept_lazily)

CODE = """
def add(a, b):
    return a + b

def sub(a, b):
    return a - b

def mul(a, b):
    return a * b
"""


def words(text):
    return re.findall(r"\w+|\S", text)


def ids(words, vocab):
    return [vocab.setdefault(w, len(vocab)) for w in words]


def naive_lookup(toks, k, min_n=2, max_n=4):
    """The most recent earlier occurrence of the longest last n-gram, by a scan; its continuation."""
    L = len(toks)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        tail = toks[L - n:]
        for p in range(L - 1, n - 1, -1):  # p: where the continuation starts (p < L)
            if toks[p - n:p] == tail:
                out = []
                for j in range(k):
                    out.append(toks[p + j] if p + j < L else out[p + j - L])
                return out
    return []


# -- the n-gram drafter --

def test_repetitive_code_is_drafted_from_its_earlier_occurrence():
    vocab: dict[str, int] = {}
    toks = ids(words(CODE), vocab)
    d = PromptLookup(toks)
    d.append(ids(words("def div(a, b):"), vocab))  # "a, b):" was seen: "return a" followed
    m, draft = d.lookup(3)
    assert draft == ids(["return", "a", "*"], vocab)  # the most recent one: mul's
    assert m >= 2
    assert d.lookup(0) == (0, [])


def test_a_repeating_pattern_keeps_repeating_past_the_end():
    d = PromptLookup([1, 2, 3, 1, 2, 3, 1, 2])
    assert d.lookup(5)[1] == [3, 1, 2, 3, 1]
    d = PromptLookup([7, 7, 7])
    assert d.lookup(4)[1] == [7, 7, 7, 7]


def test_longer_matches_win_and_shorter_ones_are_the_fallback():
    # the last 3 tokens (5, 1, 2) occurred once, followed by 9; (1, 2) alone last by 8
    d = PromptLookup([5, 1, 2, 9, 0, 1, 2, 8, 0, 5, 1, 2])
    assert d.lookup(1)[1] == [9]
    d = PromptLookup([5, 1, 2, 9, 0, 1, 2, 8, 0, 6, 1, 2])
    assert d.lookup(1)[1] == [8]


def test_prose_without_repeats_proposes_nothing():
    d = PromptLookup(range(100, 400))
    assert d.lookup(8) == (0, [])
    d.append(1)
    d.append(2)  # a 1-token repeat is below min_n
    d.append(150)
    assert d.lookup(8) == (0, [])


def test_incremental_append_equals_the_index_from_scratch_and_a_scan():
    rng = random.Random(1)
    toks = [rng.randrange(6) for _ in range(400)]
    one_by_one = PromptLookup()
    for i, t in enumerate(toks):
        if i % 3:
            one_by_one.append(t)
        else:
            one_by_one.append([t])
    chunked = PromptLookup()
    for i in range(0, len(toks), 37):
        chunked.append(toks[i:i + 37])
    assert one_by_one._index.maps == PromptLookup(toks)._index.maps == chunked._index.maps
    for L in range(1, len(toks), 7):
        fresh = PromptLookup(toks[:L])  # a fresh one: no source being followed
        assert fresh.lookup(5)[1] == naive_lookup(toks[:L], 5), L


def test_the_source_is_followed_while_drafts_are_accepted():
    # the original text, then a copy of it under way; a later line ends like the copy's end
    original = [10, 11, 12, 1, 2, 13, 14, 15, 16, 17]
    d = PromptLookup(original + [20, 21, 1, 2, 30, 31] + [10, 11, 12, 1, 2])
    # the most recent (1, 2) is followed by 30; the copy of original matches longer: 13
    assert d.lookup(3)[1] == [13, 14, 15]
    d.append([13, 14])  # two accepted + the model's next
    assert d.lookup(3)[1] == [15, 16, 17]


def test_cost_per_step_on_a_long_context_is_small():
    rng = random.Random(2)
    d = PromptLookup([rng.randrange(5000) for _ in range(32_768)])
    import time
    t0 = time.perf_counter()
    for _ in range(500):
        d.append(rng.randrange(5000))
        d.lookup(8)
    assert (time.perf_counter() - t0) / 500 < 200e-6  # measured ~3 µs; generous for a busy machine


# -- the shared store --

def test_the_store_drafts_from_other_requests_and_stops_at_their_end():
    store = SuffixStore(budget=100, min_len=2)
    assert store.add([1, 2, 3, 4, 5, 6])
    assert store.add([40, 41, 1, 2, 3, 50])  # the most recent (2, 3)... but a shorter match
    assert store.lookup([9, 1, 2, 3], 8) == (3, [50])  # its end: not into another sequence
    assert store.lookup([9, 2, 3, 4], 8) == (3, [5, 6])
    assert store.lookup([9, 9], 8) == (0, [])
    assert not store.add([1, 2, 3, 4, 5, 6])  # already stored
    assert not store.add([1])  # too short


def live_positions(store):
    out = set()
    for start, end, _ in store._docs:
        out.update(range(start, end))
    return out


def test_the_store_evicts_the_oldest_by_its_token_budget():
    store = SuffixStore(budget=25, min_len=2)
    docs = [[100 * i + j for j in range(10)] for i in range(1, 8)]
    for i, doc in enumerate(docs):
        assert store.add(doc)
        assert store.tokens <= 25
        # no entry of an evicted sequence is left, and the live ones are all there
        live = live_positions(store)
        values = [v for m in store._index.maps for v in m.values()]
        assert set(values) <= live
        assert len(values) == sum(end - start - n for start, end, _ in store._docs for n in (2, 3, 4))
        for doc2 in docs[:i + 1]:
            found = store.lookup(doc2[:4], 2)
            assert found == ((4, doc2[4:6]) if doc2 in docs[max(0, i - 1):i + 1] else (0, [])), (i, doc2)
    assert len(store) == 2
    assert store._base > 0  # the stream was compacted
    big = list(range(1000, 1100))
    assert store.add(big)
    assert store.tokens == 25 and len(store) == 1  # a sequence over the budget keeps its end
    assert store.lookup([1090, 1091], 3) == (2, [1092, 1093, 1094])
    assert store.lookup([1010, 1011], 3) == (0, [])


def test_the_drafter_uses_the_store_when_its_own_context_matches_less():
    store = SuffixStore(min_len=2)
    store.add([5, 6, 7, 8, 9, 10, 11])
    d = Drafter([1, 2, 3, 7, 8, 1, 2, 6, 7, 8], store=store)
    assert d.propose(3) == [9, 10, 11] and d.source == "store"  # (6, 7, 8) beats own (7, 8)
    d = Drafter([1, 2, 3, 6, 7, 8, 4, 2, 6, 7, 8], store=store)
    assert d.propose(3) == [4, 2, 6] and d.source == "self"  # (6, 7, 8) in both: a tie goes to its own
    d = Drafter([40, 41, 42], store=store)
    assert d.propose(3) == [] and d.source == ""


# -- the draft length --

def test_the_controller_raises_k_while_drafts_are_accepted():
    c = DraftController(max_k=8, row_cost=0.08)
    k0 = c.next_k()
    assert 0 < k0 < 8
    for _ in range(10):
        k = c.next_k()
        c.observe(k, k)
    assert c.next_k() == 8


def test_the_controller_backs_off_to_no_drafts_and_probes():
    c = DraftController(max_k=8, probe_interval=4, max_probe_interval=16)
    ks = []
    while (k := c.next_k()) > 0:
        ks.append(k)
        c.observe(k, 0)
        assert len(ks) < 20
    assert ks[0] > 0 and ks == sorted(ks, reverse=True)
    # at k=0: a probe on the probe_interval-th step without drafts; a failed probe doubles the
    # wait, up to the max
    gaps = []
    n = 1  # the step that just returned 0
    for _ in range(6):
        while (k := c.next_k()) == 0:
            n += 1
        n += 1
        assert k == c.probe_k
        c.observe(0, 0)  # nothing to draft: no evidence, the probe stays pending
        assert c.next_k() == c.probe_k
        c.observe(k, 0)
        gaps.append(n)
        n = 0
    assert gaps == [4, 8, 16, 16, 16, 16]
    # probes that succeed bring drafting back
    while c.next_k() == 0:
        pass
    c.observe(2, 2)
    for _ in range(3):
        k = c.next_k()
        assert k > 0
        c.observe(k, k)
    assert c._interval == 4


def test_the_cost_model_decides():
    cheap, dear = DraftController(row_cost=0.05), DraftController(row_cost=1.0)
    assert cheap.best_k(0.9) == 8 and cheap.best_k(0.5) == 3 and cheap.best_k(0.02) == 0
    assert dear.best_k(0.9) == 0  # 1.9 tokens for 2 steps does not pay
    assert cheap.expected_tokens(3, 0.5) == pytest.approx(1.875)
    assert cheap.expected_tokens(3, 1.0) == 4


def test_a_drafter_on_prose_soon_stops_drafting():
    rng = random.Random(3)
    d = Drafter([rng.randrange(50) for _ in range(200)])
    drafted_steps = 0
    for _ in range(200):
        draft = d.propose()
        truth = rng.randrange(50)
        n, emitted = accept(draft, [truth] + [rng.randrange(50) for _ in draft])
        d.observe(len(draft), n)
        d.append(emitted[-1:] if n == 0 else emitted)
        drafted_steps += bool(draft)
    assert drafted_steps < 40


# -- accepting --

def test_accept_edges():
    assert accept([1, 2, 3], [1, 2, 3, 4]) == (3, [1, 2, 3, 4])  # all: k + 1 tokens
    assert accept([1, 2, 3], [9, 2, 3, 4]) == (0, [9])  # none: the model's token
    assert accept([1, 2, 3], [1, 9, 3, 4]) == (1, [1, 9])
    assert accept([], [5]) == (0, [5])
    assert accept([1, 2], [1, 7]) == (1, [1, 7])  # rows past the mismatch are not needed
    with pytest.raises(ValueError):
        accept([1, 2], [1, 2])


def test_accept_lazily_samples_no_row_past_the_first_mismatch():
    rows = []

    def sample(i):
        rows.append(i)
        return [1, 9, 3, 4][i]

    assert accept_lazily([1, 2, 3], sample) == (1, [1, 9])
    assert rows == [0, 1]
    assert accept_lazily([1, 9, 3], lambda i: [1, 9, 3, 4][i]) == (3, [1, 9, 3, 4])
    assert accept_lazily([], lambda i: 6) == (0, [6])


V = 4
# a fake model: the next token's distribution given the last one (a Markov chain)
P = [[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]]


def sample_next(context, r):
    x, acc = r.random(), 0.0
    for t, p in enumerate(P[context[-1]]):
        acc += p
        if x < acc:
            return t
    return V - 1


def draft_for(context, k):
    return [(context[-1] + 1 + i) % V for i in range(k)]  # deterministic, often wrong


def speculative(r, length, k=2):
    out = [0]
    while len(out) < length + 1:
        draft = draft_for(out, k)
        _, emitted = accept_lazily(draft, lambda i: sample_next(out + draft[:i], r))
        out += emitted
    return tuple(out[1:length + 1])


def plain(r, length):
    out = [0]
    while len(out) < length + 1:
        out.append(sample_next(out, r))
    return tuple(out[1:])


def test_speculative_sampling_has_the_plain_distribution():
    length, draws = 3, 20_000
    exact = {}
    for a in range(V):
        for b in range(V):
            for c in range(V):
                exact[(a, b, c)] = P[0][a] * P[a][b] * P[b][c]
    r = random.Random(12345)
    counts: dict[tuple, int] = {}
    for _ in range(draws):
        s = speculative(r, length)
        counts[s] = counts.get(s, 0) + 1
    chi2 = sum((counts.get(s, 0) - draws * p) ** 2 / (draws * p) for s, p in exact.items())
    assert chi2 < 103.4  # chi-square, 63 degrees of freedom, p = 0.001
    # and a seed gives the same tokens as plain sampling (rows sampled in order, none past the
    # first mismatch, consume the random stream as plain decoding does)
    for seed in range(200):
        assert speculative(random.Random(seed), 12, k=3) == plain(random.Random(seed), 12), seed


def test_greedy_with_drafts_is_greedy():
    def greedy(context):
        return max(range(V), key=lambda t: P[context[-1]][t])

    plain_out = [1]
    for _ in range(30):
        plain_out.append(greedy(plain_out))
    d = Drafter([1])
    while len(d.tokens) < 31:
        draft = d.propose(4)
        _, emitted = accept(draft, [greedy(d.tokens + draft[:i]) for i in range(len(draft) + 1)])
        d.append(emitted)
    assert d.tokens[:31] == plain_out


# -- the measured cost of a step by its rows --

def test_step_costs_start_from_the_prior_and_follow_measurements():
    costs = StepCosts(max_rows=32, prior_row_cost=0.1, decay=0.5)
    assert costs.relative(1) == 1.0 and costs.relative(11) == pytest.approx(2.0)  # nothing measured
    costs.record(1, 0.020)
    costs.record(9, 0.040)
    costs.record(17, 0.060)
    assert costs.relative(9) == pytest.approx(2.0)
    assert costs.relative(13) == pytest.approx(2.5)  # between 9 and 17
    assert costs.relative(5) == pytest.approx(1.5)  # between 1 and 9
    assert costs.relative(27) == pytest.approx(3.0 + 0.1 * 10)  # past the widest: the prior's slope
    costs.record(9, 0.080)  # smoothed, not replaced
    assert costs.relative(9) == pytest.approx(3.0)
    costs.record(4, 0.010)  # a wide step measured faster than one row (noise) costs one row
    assert costs.relative(4) == 1.0
    costs.record(40, 1.0)  # out of range: ignored
    costs.record(3, 0.0)
    assert set(costs.measured()) == {1, 4, 9, 17}


def test_the_controller_drafts_as_long_as_the_measured_costs_make_it_pay():
    flat, steep = StepCosts(32), StepCosts(32)
    for n in range(1, 33):
        flat.record(n, 0.020 + 0.0005 * (n - 1))  # wide steps almost free: long drafts pay
        steep.record(n, 0.020 * n)  # every row costs a step: no draft pays
    a = 0.97
    long_ = DraftController(max_k=31, costs=flat)
    none = DraftController(max_k=31, costs=steep)
    assert long_.best_k(a) == 31
    assert none.best_k(a) == 0
    # the same acceptance at the prior's 0.08 a row: a middle length
    assert 8 <= DraftController(max_k=31).best_k(a) < 31
