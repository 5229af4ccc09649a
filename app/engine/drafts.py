"""Draft-free speculative decoding: proposing drafts, choosing how many, accepting them.

Pure logic (no model, no I/O). The engine verifies a draft of k tokens in one forward of k + 1
rows (row i: the model's choice after the context + draft[:i]), samples each row with the normal
sampler, and accepts drafts while the sampled token equals the drafted one (`accept`): for a
deterministic draft that is the standard speculative rejection rule, so the output has the same
distribution as plain decoding (byte-identical at temperature 0, and for a seed when the rows are
sampled in order and none past the first mismatch: `accept_lazily`).

- `PromptLookup`: the n-gram ("prompt lookup") drafter over one request's tokens (prompt +
  output so far). An index n-gram -> the most recent position that followed it (n in min_n..max_n) is
  updated as tokens are appended; a proposal looks up the context's last max_n tokens (backing
  off to shorter n), scores each candidate by how far its match extends backwards (the longest
  wins, then the most recent), and copies what followed it (periodically past the end of the
  context: a repeating pattern keeps repeating). The source it copied from is followed while
  drafts are accepted (an edited file is copied from its original, not from a recent line that
  happens to end the same way).
- `SuffixStore`: the same index over recent requests' token sequences (prompts + outputs of
  finished requests), shared across requests, bounded by a total token budget (oldest evicted).
  A request consults it when its own context has no match, or a shorter one.
- `DraftController`: the adaptive draft length of one request. It estimates the per-token
  acceptance rate a (exponentially weighted counts, with a prior) and picks the k in 0..max_k
  that maximises the expected tokens per verify, (1 - a^(k+1)) / (1 - a), over its cost in decode
  steps, 1 + row_cost * k. k = 0 (no drafting) when drafting does not pay by min_gain; it then
  probes again now and then (an interval that doubles while probes fail).
- `Drafter`: the three together for one request: `propose() -> list[int]`,
  `observe(drafted, accepted)`, `append(tokens)`.

Measured with `python -m bench.drafts` (2 shared CPU cores, Python 3.11, Qwen2.5-Coder's
tokenizer, the defaults: min_n 2, max_n 4, max_k 8, row_cost 0.08):

- Cost, 32k-token context of this repo's code: the index of a prompt builds at 0.4 µs/token
  (13 ms for 32k) and takes ~235 bytes/token; append one token + propose 8: ~3 µs; a store
  lookup ~2 µs; a `Drafter` with a store, per step (append, propose, observe): ~8 µs.
- Edit (the context is app/engine/engine.py, 6.1k tokens; the output the same file with
  `claim` renamed, 6.1k tokens), mean drafts a greedy verifier accepts per verify step:
  k=4: 3.80, k=8: 7.29, k=16: 13.44 (precision 0.96 / 0.94 / 0.88); the controller with
  max_k 8: 7.28. At row_cost 0.08: 3.6x / 5.1x / 6.5x fewer decode-step equivalents.
  Choices measured at k=8: min_n 1: 7.41, min_n 3: 7.11, max_n 3: 7.26, max_n 6: 7.29;
  without following the source: 6.27 (the most recent occurrence of a 4-gram is often a
  line of the output itself, not the original being copied).
- Store: a second request rewriting the first one's output (another rename) with no file in
  its prompt: 0.23 accepted per verify at k=8 without the store, 6.54 with it.
- Prose (docs/architecture.md as an answer to a short question): k=8 always: 0.09 accepted per
  verify, a loss (0.97x at row_cost 0.08); the controller drafts 5x fewer tokens: 1.05x.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

NO_TOKEN = -1  # a separator in the suffix store's stream: never a token id


def _match_back(a: Sequence[int], i: int, b: Sequence[int], j: int, limit: int) -> int:
    """How many tokens a[..i] and b[..j] (inclusive ends, going backwards) share, at most limit."""
    m = 0
    while m < limit and i - m >= 0 and j - m >= 0 and a[i - m] == b[j - m]:
        m += 1
    return m


class _NgramIndex:
    """n-gram (as its hash) -> the most recent position that followed it, for n in min_n..max_n.

    Positions are whatever the owner uses (indexes in a list or a stream); a hash collision only
    makes a wrong candidate, which the owner's backward check rejects.
    """

    def __init__(self, min_n: int, max_n: int):
        if not 1 <= min_n <= max_n:
            raise ValueError("need 1 <= min_n <= max_n")
        self.min_n, self.max_n = min_n, max_n
        self.maps: list[dict[int, int]] = [{} for _ in range(max_n - min_n + 1)]

    def add(self, toks: Sequence[int], pos: int, lo: int = 0, offset: int = 0) -> None:
        """Index the n-grams ending just before toks[pos] (starting at lo or later) as followed by
        pos (stored as pos + offset)."""
        value = pos + offset
        for n in range(self.min_n, min(self.max_n, pos - lo) + 1):
            self.maps[n - self.min_n][hash(tuple(toks[pos - n:pos]))] = value

    def _grams(self, toks: Sequence[int], p0: int, p1: int, lo: int, n: int, offset: int):
        start = max(p0, lo + n)
        grams = zip(*(toks[start - n + j:p1 - n + j] for j in range(n)))
        return zip(map(hash, grams), range(start + offset, p1 + offset))

    def add_range(self, toks: Sequence[int], p0: int, p1: int, lo: int = 0, offset: int = 0) -> None:
        """`add` for each pos in p0..p1-1, at once (later positions win, as one by one)."""
        for n in range(self.min_n, self.max_n + 1):
            self.maps[n - self.min_n].update(self._grams(toks, p0, p1, lo, n, offset))

    def remove_range(self, toks: Sequence[int], p0: int, p1: int, lo: int, offset: int = 0) -> None:
        """Forget the n-grams ending before toks[pos], pos in p0..p1-1, that still point at pos (+ offset)."""
        for n in range(self.min_n, self.max_n + 1):
            m = self.maps[n - self.min_n]
            for key, value in self._grams(toks, p0, p1, lo, n, offset):
                if m.get(key) == value:
                    del m[key]

    def candidate(self, tail: Sequence[int]) -> tuple[int, int]:
        """(n, the position that last followed the longest n-gram ending tail), or (0, -1)."""
        for n in range(min(self.max_n, len(tail)), self.min_n - 1, -1):
            got = self.maps[n - self.min_n].get(hash(tuple(tail[len(tail) - n:])))
            if got is not None:
                return n, got
        return 0, -1


class PromptLookup:
    """The n-gram drafter over one request's tokens, updated incrementally (`append`)."""

    def __init__(self, tokens: Iterable[int] = (), *, min_n: int = 2, max_n: int = 4,
                 max_match: int = 64):
        self.tokens: list[int] = []
        self.max_match = max_match  # how far back a candidate's match is checked
        self._index = _NgramIndex(min_n, max_n)
        self._source: int | None = None  # where the last proposal copied from
        self._source_len = 0  # the context length then
        self.last_match = 0  # the match length of the last proposal
        self.append(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, tokens: int | Iterable[int]) -> None:
        # the n-grams ending before a new token are followed by it: index them (the context's own
        # last n-gram is not indexed until a token follows it)
        toks = self.tokens
        if isinstance(tokens, int):
            toks.append(tokens)
            self._index.add(toks, len(toks) - 1)
            return
        p0 = len(toks)
        toks.extend(tokens)
        if len(toks) - p0 > 8:
            self._index.add_range(toks, p0, len(toks))
        else:
            for pos in range(p0, len(toks)):
                self._index.add(toks, pos)

    def lookup(self, k: int) -> tuple[int, list[int]]:
        """(match length, up to k drafted tokens) from the best earlier occurrence; (0, []) if none."""
        toks = self.tokens
        L = len(toks)
        self.last_match = 0
        if k <= 0 or L < 2:
            return 0, []
        n, p = self._index.candidate(toks)
        best, best_m = -1, 0
        limit = min(self.max_match, L - 1)
        if self._source is not None:  # the source of the last proposal, advanced as the context was
            q = self._source + (L - self._source_len)
            if q < L:
                m = _match_back(toks, q - 1, toks, L - 1, limit)
                if m >= self._index.min_n:
                    best, best_m = q, m
        if p >= 0 and p != best:
            m = _match_back(toks, p - 1, toks, L - 1, limit)
            if m > best_m and m >= n:
                best, best_m = p, m
        if best < 0:
            self._source = None
            return 0, []
        self._source, self._source_len, self.last_match = best, L, best_m
        out: list[int] = []
        for j in range(k):  # past the end of the context: the draft itself (a period of L - best)
            i = best + j
            out.append(toks[i] if i < L else out[i - L])
        return best_m, out


class SuffixStore:
    """Recent requests' token sequences, indexed like `PromptLookup`, shared across requests.

    Bounded by `budget` tokens in all (oldest sequences evicted; a longer one keeps its end).
    An identical sequence already stored is not stored twice. Thread-safe.
    """

    def __init__(self, budget: int = 131_072, *, min_n: int = 2, max_n: int = 4,
                 max_match: int = 64, min_len: int = 8):
        self.budget = budget
        self.max_match = max_match
        self.min_len = min_len  # shorter sequences are not worth storing
        self._index = _NgramIndex(min_n, max_n)
        self._stream: list[int] = []  # the sequences, each followed by NO_TOKEN
        self._base = 0  # the global position of _stream[0] (global positions never move)
        self._docs: deque[tuple[int, int, int]] = deque()  # (global start, global end, hash)
        self._hashes: set[int] = set()
        self._tokens = 0
        self._lock = threading.Lock()

    @property
    def tokens(self) -> int:
        return self._tokens

    def __len__(self) -> int:
        return len(self._docs)

    def add(self, tokens: Sequence[int]) -> bool:
        """Store one sequence (e.g. a finished request's prompt + output). False if not stored."""
        toks = list(tokens)[-self.budget:] if self.budget > 0 else []
        if len(toks) < self.min_len:
            return False
        h = hash(tuple(toks))
        with self._lock:
            if h in self._hashes:
                return False
            while self._docs and self._tokens + len(toks) > self.budget:
                self._evict()
            s = self._stream
            lo = len(s)
            start = self._base + lo
            s.extend(toks)
            s.append(NO_TOKEN)
            self._index.add_range(s, lo + 1, lo + len(toks), lo, self._base)  # as global positions
            self._docs.append((start, start + len(toks), h))
            self._hashes.add(h)
            self._tokens += len(toks)
            return True

    def _evict(self) -> None:
        start, end, h = self._docs.popleft()
        s, base = self._stream, self._base
        lo, hi = start - base, end - base
        self._index.remove_range(s, lo + 1, hi, lo, base)
        self._hashes.discard(h)
        self._tokens -= end - start
        dead = hi + 1  # the stream's sequences before here are gone
        if dead * 2 >= len(s):  # compact when most of the stream is dead
            del s[:dead]
            self._base += dead

    def lookup(self, context: Sequence[int], k: int) -> tuple[int, list[int]]:
        """(match length, up to k tokens that followed the context's end in a stored sequence)."""
        if k <= 0 or len(context) < self._index.min_n:
            return 0, []
        tail = context[-self._index.max_n:]
        with self._lock:
            n, p = self._index.candidate(tail)
            if p < 0:
                return 0, []
            s, best = self._stream, p - self._base
            best_m = _match_back(s, best - 1, context, len(context) - 1, min(self.max_match, len(context)))
            if best_m < n:  # a hash collision
                return 0, []
            out = []
            for t in s[best:best + k]:
                if t == NO_TOKEN:
                    break
                out.append(t)
            return best_m, out


class StepCosts:
    """What a decode step of n rows costs, in steps of one row, as measured on this host.

    The engine records each decode call (its rows and its wall time: the forward call and the
    rows' sampling); `relative(n)` is the smoothed time of an n-row step over a one-row step's.
    A row count not yet measured is interpolated between the nearest measured ones; past the
    widest measured, or with nothing measured, the prior `1 + prior_row_cost * (n - 1)` steps
    (extrapolated from the widest measurement): an untried width is tried once a request's
    acceptance makes it worth it, and then it is known. The shape differs between CPUs (a gemv
    pass per four rows, panels from eight, AMX tiles from 16) and with load, so it is measured,
    not assumed. Shared by every request of an engine; thread-safe enough for one writer.
    """

    def __init__(self, max_rows: int = 32, prior_row_cost: float = 0.08, decay: float = 0.8):
        self.max_rows = max(1, max_rows)
        self.prior_row_cost = prior_row_cost
        self.decay = decay
        self._ms: list[float | None] = [None] * (self.max_rows + 1)

    def record(self, rows: int, seconds: float) -> None:
        """A decode step of `rows` rows took `seconds` (the forward call and its sampling)."""
        if not 1 <= rows <= self.max_rows or not seconds > 0:
            return
        ms = seconds * 1000.0
        old = self._ms[rows]
        self._ms[rows] = ms if old is None else old * self.decay + ms * (1.0 - self.decay)

    def measured(self) -> dict[int, float]:
        """The smoothed ms of each row count measured so far."""
        return {n: ms for n, ms in enumerate(self._ms) if ms is not None}

    def relative(self, rows: int) -> float:
        """An n-row step's cost in one-row steps (at least 1, never less than a narrower one's)."""
        rows = max(1, min(rows, self.max_rows))
        if rows == 1:
            return 1.0
        one = self._ms[1]
        if one is None:
            return 1.0 + self.prior_row_cost * (rows - 1)
        lo, hi = 1, None
        for n in range(rows, 1, -1):
            if self._ms[n] is not None:
                lo = n
                break
        for n in range(rows + 1, self.max_rows + 1):
            if self._ms[n] is not None:
                hi = n
                break
        lo_ms = self._ms[lo]
        if lo == rows:
            cost = lo_ms / one
        elif hi is not None:
            cost = (lo_ms + (self._ms[hi] - lo_ms) * (rows - lo) / (hi - lo)) / one
        else:
            cost = lo_ms / one + self.prior_row_cost * (rows - lo)
        return max(1.0, cost)


@dataclass
class DraftController:
    """How many tokens one request drafts next: `next_k()`, then `observe(drafted, accepted)`."""

    max_k: int = 8
    row_cost: float = 0.08  # without `costs`: a verify of k drafts costs 1 + row_cost * k decode steps
    costs: StepCosts | None = None  # the measured cost of a step by its rows (the engine's)
    min_gain: float = 0.03  # draft only when it yields this much more per decode step
    decay: float = 0.9  # weight of the past per verify (the estimate's memory: ~10 verifies)
    prior: float = 0.5  # the acceptance rate assumed before any evidence ...
    prior_weight: float = 2.0  # ... worth this many drafted tokens
    probe_k: int = 2  # the draft length of a probe while drafting does not pay
    probe_interval: int = 16  # steps between probes, doubling while probes fail ...
    max_probe_interval: int = 512  # ... up to this

    def __post_init__(self):
        self._accepted = 0.0  # weighted accepted drafts
        self._trials = 0.0  # weighted drafts checked (the accepted + the first rejected)
        self._idle = 0  # steps without drafting since the last draft
        self._interval = self.probe_interval
        self._probing = False

    @property
    def acceptance(self) -> float:
        """The estimated probability that a draft token is accepted (given its predecessors were)."""
        return (self._accepted + self.prior * self.prior_weight) / (self._trials + self.prior_weight)

    def expected_tokens(self, k: int, a: float | None = None) -> float:
        """The expected tokens one verify of k drafts emits: 1 + a + ... + a^k."""
        a = self.acceptance if a is None else a
        return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)

    def best_k(self, a: float | None = None) -> int:
        """The k in 0..max_k with the most tokens per decode step; 0 unless it gains min_gain."""
        a = self.acceptance if a is None else a
        best, best_rate = 0, 1.0 + self.min_gain
        tokens, power = 1.0, 1.0
        costs = self.costs
        for k in range(1, self.max_k + 1):
            power *= a
            tokens += power  # expected_tokens(k, a)
            rate = tokens / (costs.relative(1 + k) if costs is not None else 1.0 + self.row_cost * k)
            if rate > best_rate:
                best, best_rate = k, rate
        return best

    def next_k(self) -> int:
        """The draft length for the next step (call once per decode step)."""
        k = self.best_k()
        if k:
            return k
        if self._probing:
            return min(self.probe_k, self.max_k)
        self._idle += 1
        if self._idle >= self._interval:
            self._probing = True
            return min(self.probe_k, self.max_k)
        return 0

    def observe(self, drafted: int, accepted: int) -> None:
        """The result of a verify: `accepted` of the `drafted` tokens were accepted."""
        if drafted <= 0:  # nothing drafted (no match): no evidence; a probe stays pending
            return
        accepted = max(0, min(accepted, drafted))
        self._accepted = self._accepted * self.decay + accepted
        self._trials = self._trials * self.decay + accepted + (accepted < drafted)
        self._idle = 0
        if self.best_k():
            self._interval = self.probe_interval
        elif self._probing:  # a failed probe: wait twice as long for the next one
            self._interval = min(self._interval * 2, self.max_probe_interval)
        self._probing = False


class Drafter:
    """Drafting for one request: its own context first, the shared store when that is better."""

    def __init__(self, tokens: Iterable[int] = (), *, store: SuffixStore | None = None,
                 controller: DraftController | None = None, min_n: int = 2, max_n: int = 4):
        self.lookup = PromptLookup(tokens, min_n=min_n, max_n=max_n)
        self.store = store
        self.controller = controller if controller is not None else DraftController()
        self.source = ""  # where the last draft came from: "", "self" or "store"

    @property
    def tokens(self) -> list[int]:
        return self.lookup.tokens

    def append(self, tokens: int | Iterable[int]) -> None:
        """The tokens emitted (the prompt's, then each step's accepted drafts + the corrected token)."""
        self.lookup.append(tokens)

    def propose(self, k: int | None = None, limit: int | None = None) -> list[int]:
        """Up to k (default: the controller's choice) tokens to verify after the context, and at
        most limit (e.g. the tokens left to generate - 1, the room left in the context); [] for none."""
        if k is None:
            k = self.controller.next_k()
        if limit is not None:
            k = min(k, limit)
        self.source = ""
        if k <= 0:
            return []
        m, draft = self.lookup.lookup(k)
        if self.store is not None:
            sm, sdraft = self.store.lookup(self.lookup.tokens, k)
            if sm > m or (sm == m and len(sdraft) > len(draft)):
                self.source = "store" if sdraft else ""
                return sdraft
        self.source = "self" if draft else ""
        return draft

    def observe(self, drafted: int, accepted: int) -> None:
        self.controller.observe(drafted, accepted)


def accept(draft: Sequence[int], sampled: Sequence[int]) -> tuple[int, list[int]]:
    """How many drafts are accepted, and the tokens to emit (those + the model's next token).

    sampled[i] is the token sampled from verify row i (the model after the context + draft[:i]);
    it needs len(draft) + 1 rows, or at least the rows up to the first mismatch.
    """
    n = 0
    while n < len(draft) and n < len(sampled) and sampled[n] == draft[n]:
        n += 1
    if n >= len(sampled):
        raise ValueError(f"{len(sampled)} sampled rows for {len(draft)} drafts: need row {n}")
    return n, [*draft[:n], sampled[n]]


def accept_lazily(draft: Sequence[int], sample: Callable[[int], int]) -> tuple[int, list[int]]:
    """`accept`, sampling row i only when the drafts before it were accepted (sample(i) -> token).

    Sampling rows in order and none past the first mismatch consumes the sampler's random
    stream (and its token history, for penalties) exactly as plain decoding would.
    """
    out: list[int] = []
    for i in range(len(draft) + 1):
        t = sample(i)
        out.append(t)
        if i == len(draft) or t != draft[i]:
            return i, out
    raise AssertionError("unreachable")
