"""The native sampler (native/src/sampler.cpp) over fixed logits, against a Python reference of
what etserve.h specifies: logit bias, repetition / presence / frequency penalties over the history,
the allowed-token mask (and its fallback to raw logits), then greedy, or temperature -> top-k ->
min-p -> top-p -> draw. Draws are checked with a chi-square test (Wilson-Hilferty normal
approximation, so no scipy): at the threshold used, a correct sampler fails about once in
300,000 runs; the seeds are fixed, so a run is reproducible.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

from app.engine.native import Status, _Sampling

N_DRAWS = 20_000
Z_LIMIT = 4.5  # one-sided normal quantile: p ~ 3.4e-6


@pytest.fixture(scope="module")
def sample_fn(etserve_test_lib):
    fn = etserve_test_lib.etserve_test_sample
    fn.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_int64, ctypes.POINTER(_Sampling),
                   ctypes.POINTER(ctypes.c_uint64), ctypes.c_int32, ctypes.POINTER(ctypes.c_int32),
                   ctypes.POINTER(ctypes.c_float)]
    fn.restype = ctypes.c_int
    return fn


class Sampler:
    """One parameter set over one logits vector, drawing with the native sampler."""

    def __init__(self, fn, logits, *, history=(), bias=None, allowed=None, **params):
        self.fn = fn
        self.logits = np.asarray(logits, np.float32)
        self._logits_c = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        p = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                 presence_penalty=0.0, frequency_penalty=0.0)
        p.update(params)
        self.s = _Sampling(**p)
        self._keep = []
        if history:
            h = (ctypes.c_int32 * len(history))(*history)
            self.s.history, self.s.n_history = h, len(history)
            self._keep.append(h)
        if bias:
            ids = (ctypes.c_int32 * len(bias))(*bias)
            values = (ctypes.c_float * len(bias))(*bias.values())
            self.s.bias_ids, self.s.bias_values, self.s.n_bias = ids, values, len(bias)
            self._keep += [ids, values]
        if allowed is not None:
            words = (ctypes.c_uint32 * ((len(self.logits) + 31) // 32))()
            for t in allowed:
                words[t // 32] |= 1 << (t % 32)
            self.s.allowed, self.s.n_allowed_words = words, len(words)
            self._keep.append(words)
        self.rng = ctypes.c_uint64(12345)

    def one(self) -> tuple[int, int, float]:
        token, logprob = ctypes.c_int32(-1), ctypes.c_float()
        status = self.fn(self._logits_c, len(self.logits), ctypes.byref(self.s), ctypes.byref(self.rng), 1,
                         ctypes.byref(token), ctypes.byref(logprob))
        return status, token.value, logprob.value

    def draws(self, n: int = N_DRAWS) -> np.ndarray:
        tokens = np.full(n, -1, np.int32)
        status = self.fn(self._logits_c, len(self.logits), ctypes.byref(self.s), ctypes.byref(self.rng), n,
                         tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), None)
        assert status == Status.OK
        return np.bincount(tokens, minlength=len(self.logits))


# --- the reference -------------------------------------------------------------------------------

def processed(logits, *, history=(), bias=None, allowed=None, repetition_penalty=1.0, presence_penalty=0.0,
              frequency_penalty=0.0, **_):
    """Bias, penalties, mask: the logits the draw starts from (float64)."""
    raw = np.asarray(logits, np.float64)
    x = raw.copy()
    for t, b in (bias or {}).items():
        x[t] = -np.inf if b <= -100 else x[t] + b
    counts: dict[int, int] = {}
    for t in history:
        counts[t] = counts.get(t, 0) + 1
    for t, c in counts.items():
        v = x[t]
        if repetition_penalty != 1.0:
            v = v / repetition_penalty if v > 0 else v * repetition_penalty
        x[t] = v - (presence_penalty + frequency_penalty * c)
    if allowed is not None:
        mask = np.zeros(len(x), bool)
        mask[list(allowed)] = True
        x[~mask] = -np.inf
        if not np.isfinite(x[mask]).any():  # the constraint outranks the preferences
            x[mask] = raw[mask]
    return x


def reference_probs(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, **kw) -> np.ndarray:
    x = processed(logits, **kw)
    order = sorted(range(len(x)), key=lambda i: (-x[i], i))
    if top_k > 0:
        order = order[:top_k]
    best = x[order[0]]
    w = {i: math.exp((x[i] - best) / temperature) for i in order}
    if min_p > 0:
        order = [i for i in order if w[i] >= min_p] or order[:1]
    if 0 < top_p < 1:
        target, cum, kept = top_p * sum(w[i] for i in order), 0.0, []
        for i in order:
            if cum >= target:
                break
            kept.append(i)
            cum += w[i]
        order = kept
    probs = np.zeros(len(x))
    total = sum(w[i] for i in order)
    for i in order:
        probs[i] = w[i] / total
    return probs


def assert_follows(counts: np.ndarray, probs: np.ndarray, bins: np.ndarray | None = None) -> None:
    """Chi-square goodness of fit; a token of probability 0 must never be drawn."""
    n = counts.sum()
    assert counts[probs == 0].sum() == 0, f"drew excluded tokens {np.nonzero(counts * (probs == 0))[0][:10]}"
    if bins is not None:  # many small categories: compare sums over groups of tokens
        counts = np.bincount(bins, weights=counts)
        probs = np.bincount(bins, weights=probs)
    # the least likely categories are pooled until each group is expected 5 times or more (the
    # chi-square approximation needs it)
    live = np.nonzero(probs > 0)[0]
    groups, group, mass = [], [], 0.0
    for i in live[np.argsort(probs[live], kind="stable")]:
        group.append(i)
        mass += probs[i]
        if mass * n >= 5:
            groups.append(group)
            group, mass = [], 0.0
    if group:
        groups[-1] += group
    counts = np.array([counts[g].sum() for g in groups])
    probs = np.array([probs[g].sum() for g in groups])
    keep = probs > 0
    expected = probs[keep] * n
    assert expected.min() >= 5, "too few draws for a chi-square test"
    chi2 = float(((counts[keep] - expected) ** 2 / expected).sum())
    df = int(keep.sum()) - 1
    if df == 0:
        return
    z = ((chi2 / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    assert z < Z_LIMIT, f"chi2 {chi2:.1f} over {df} degrees of freedom (z {z:.1f}): {counts} vs {expected.round()}"


LOGITS = [2.0, 1.5, 1.2, 1.0, 0.7, 0.3, 0.0, -0.4, -1.0, -1.5, -2.5, -4.0]


@pytest.mark.parametrize("params", [
    dict(temperature=1.0),
    dict(temperature=0.6),
    dict(temperature=1.7),
    dict(temperature=0.9, top_k=4),
    dict(temperature=1.0, top_p=0.7),
    dict(temperature=1.3, top_p=0.9),
    dict(temperature=1.0, min_p=0.15),
    dict(temperature=0.8, top_k=8, min_p=0.05, top_p=0.85),
], ids=str)
def test_draws_follow_the_distribution(sample_fn, params):
    probs = reference_probs(LOGITS, **params)
    assert (probs >= 0.05).sum() >= 3  # not degenerate: several tokens are likely
    if {"top_k", "top_p", "min_p"} & set(params):
        assert (probs == 0).any()  # and the filter excludes some
    assert_follows(Sampler(sample_fn, LOGITS, **params).draws(), probs)


@pytest.mark.parametrize("params", [
    dict(repetition_penalty=1.3, history=[0, 0, 2, 8]),  # positive and negative logits
    dict(presence_penalty=0.8, history=[0, 1, 1, 5]),
    dict(frequency_penalty=0.5, history=[0, 0, 0, 1, 3, 3]),
    dict(repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.2, history=[1, 1, 2, 9, 9]),
    dict(bias={3: 2.0, 0: -100.0}),
], ids=str)
def test_penalties_and_bias_change_the_distribution_as_specified(sample_fn, params):
    probs = reference_probs(LOGITS, **params)
    assert not np.allclose(probs, reference_probs(LOGITS))  # the parameters do change something
    assert_follows(Sampler(sample_fn, LOGITS, **params).draws(), probs)


def test_penalties_under_greedy_match_the_reference(sample_fn):
    rng = np.random.default_rng(7)
    for _ in range(400):
        logits = rng.normal(0, 2, 40).astype(np.float32)
        params = dict(repetition_penalty=float(rng.uniform(0.7, 2.0)), presence_penalty=float(rng.uniform(-1, 1.5)),
                      frequency_penalty=float(rng.uniform(-0.5, 1.0)), history=list(rng.integers(0, 40, 12)))
        x = processed(logits, **params)
        if np.sort(x)[-1] - np.sort(x)[-2] < 1e-4:
            continue  # a near tie: float32 rounding may pick either
        status, token, logprob = Sampler(sample_fn, logits, temperature=0.0, **params).one()
        assert status == Status.OK and token == int(np.argmax(x)), params
        # the logprob is the model's own, before penalties
        raw = logits.astype(np.float64)
        assert logprob == pytest.approx(raw[token] - np.log(np.exp(raw - raw.max()).sum()) - raw.max(), abs=1e-4)


def test_the_mask_limits_the_draw(sample_fn):
    allowed = [1, 4, 5, 9]
    params = dict(temperature=1.0, allowed=allowed)
    assert_follows(Sampler(sample_fn, LOGITS, **params).draws(), reference_probs(LOGITS, **params))


def test_the_mask_falls_back_to_raw_logits_when_preferences_ban_every_allowed_token(sample_fn):
    allowed = [2, 3, 7]
    params = dict(temperature=1.0, allowed=allowed, bias={2: -100.0, 3: -100.0, 7: -100.0})
    probs = reference_probs(LOGITS, **params)
    assert set(np.nonzero(probs)[0]) == set(allowed)
    assert_follows(Sampler(sample_fn, LOGITS, **params).draws(), probs)
    status, token, _ = Sampler(sample_fn, LOGITS, temperature=0.0, allowed=allowed,
                               bias={2: -100.0, 3: -100.0, 7: -100.0}).one()
    assert status == Status.OK and token == 2


def test_a_mask_that_allows_nothing_is_refused(sample_fn):
    status, _, _ = Sampler(sample_fn, LOGITS, allowed=[]).one()
    assert status == Status.INVALID_ARGUMENT
    status, _, _ = Sampler(sample_fn, LOGITS, allowed=[len(LOGITS) + 3]).one()  # outside the vocabulary
    assert status == Status.INVALID_ARGUMENT


def test_top_p_widens_past_the_first_256_candidates(sample_fn):
    # a nearly flat distribution over 5000 tokens: top_p 0.9 needs ~4500 of them, so the sorted
    # head (256 candidates first) must widen twice
    vocab = 5000
    logits = (-np.arange(vocab) * 2e-5).astype(np.float32)
    params = dict(temperature=1.0, top_p=0.9)
    probs = reference_probs(logits, **params)
    kept = int((probs > 0).sum())
    assert 4000 < kept < vocab
    counts = Sampler(sample_fn, logits, **params).draws(4_000)  # ~1 ms each: the whole vocabulary is sorted
    assert_follows(counts, probs, bins=np.arange(vocab) * 10 // vocab)
    assert counts[kept:].sum() == 0 and counts[kept - 500:kept].sum() > 0  # drawn up to the cut, never past it


def test_bad_parameters_are_refused(sample_fn):
    for bad in (dict(temperature=-1.0), dict(top_p=-0.1), dict(min_p=-0.5), dict(top_k=-2),
                dict(repetition_penalty=0.0), dict(bias={len(LOGITS): 1.0}), dict(temperature=float("nan"))):
        assert Sampler(sample_fn, LOGITS, **bad).one()[0] == Status.INVALID_ARGUMENT, bad


def test_the_same_seed_gives_the_same_draws(sample_fn):
    a = Sampler(sample_fn, LOGITS, temperature=1.0)
    b = Sampler(sample_fn, LOGITS, temperature=1.0)
    assert [a.one()[1] for _ in range(50)] == [b.one()[1] for _ in range(50)]
    b.rng.value = 999
    assert [a.one()[1] for _ in range(50)] != [b.one()[1] for _ in range(50)]


QWEN_VOCAB = 151_936


def test_a_whole_vocabulary_reports_exact_logprobs_and_never_draws_a_banned_token(sample_fn):
    """At Qwen's vocabulary size (where the vectorized exp sums run over 151,936 logits): each
    draw's logprob is the model's own to 1e-4, and a draw at a low temperature from a vocabulary
    whose best tokens are banned (bias -100) or masked out only ever returns an allowed one."""
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal(QWEN_VOCAB) * 4).astype(np.float32)
    raw = logits.astype(np.float64)
    lse = raw.max() + np.log(np.exp(raw - raw.max()).sum())
    s = Sampler(sample_fn, logits, temperature=1.0, top_p=0.95)
    for _ in range(20):
        status, token, logprob = s.one()
        assert status == Status.OK and logprob == pytest.approx(raw[token] - lse, abs=1e-4)
    best = np.argsort(-logits)[:50]
    allowed = set(int(t) for t in rng.choice(QWEN_VOCAB, 200, replace=False)) | {int(t) for t in best[:5]}
    banned = {int(t): -100.0 for t in best[:5]}
    for temperature in (0.05, 1.0, 3.0):
        counts = Sampler(sample_fn, logits, temperature=temperature, bias=banned, allowed=allowed).draws(500)
        drawn = set(np.flatnonzero(counts).tolist())
        assert drawn <= allowed - set(banned), temperature
