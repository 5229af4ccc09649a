"""Context shift (issue 13, item 6) on the real test model, whose context is 512 tokens."""

from __future__ import annotations

import pytest

from app.engine import CancelToken, ContextLengthError, Engine, GenerationRequest, NativeModel, SamplingParams
from app.engine.sessions import common_prefix

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def model(model_dir):
    """A runtime of its own: these engines must not clobber the cache served_model's engine relies on."""
    m = NativeModel(model_dir / "model.pte")
    yield m
    m.close()


def chat_prompt(served_model, system: str, user: str) -> tuple[list[int], int]:
    """A chat prompt, and how many of its tokens the system prompt's turn takes (what it shares
    with a prompt of another user message)."""
    tok, template = served_model.tokenizer, served_model.template

    def render(text):
        return tok.encode(template.render([{"role": "system", "content": system}, {"role": "user", "content": text}],
                                          add_generation_prompt=True))

    ids = render(user)
    return ids, common_prefix(ids, render("?"))


def generate(engine, ids, max_tokens, keep=None, logprobs=None):
    gen = engine.generate(GenerationRequest(ids, max_tokens, GREEDY, frozenset(), keep=keep))
    events = list(gen)
    if logprobs is not None:
        logprobs.extend(e.logprob for e in events)
    return [e.token_id for e in events], gen.stats


def kept_tokens(prompt, out, context, keep):
    """What the first shift keeps, as a fresh prompt: the tokens in the cache when it was full
    (the prompt and all generated tokens but the one about to be run), the first `keep` of
    them, the newer half of the rest, then the token about to be run."""
    t = context + 1 - len(prompt)  # tokens generated when the cache is full
    cache = prompt + out[: t - 1]
    assert len(cache) == context
    discard = (context - keep) // 2
    return cache[:keep] + cache[keep + discard :] + [out[t - 1]], t, discard


NOTES = ("Notes from the harbour log. The lighthouse keeper trims the wick, winds the clockwork that turns "
         "the lens, writes down the wind and the swell, and watches for ships in trouble. ") * 12


def test_generation_goes_past_the_context_and_equals_a_fresh_run_on_the_kept_tokens(model, served_model):
    # a long prompt, so that the context fills after a few dozen tokens
    ids, keep = chat_prompt(served_model, "You are a storyteller. You write long stories about the sea.",
                            NOTES[:1500] + " Now tell me a very long story about the keeper.")
    engine = Engine(model, context_shift=True, keep=keep)
    context = engine.context_length
    assert 350 < len(ids) < context - 40
    t = context + 1 - len(ids)  # tokens generated when the cache is full
    max_tokens = t + 40
    shifted_logprobs, fresh_logprobs = [], []
    out, stats = generate(engine, ids, max_tokens, logprobs=shifted_logprobs)
    assert len(out) == max_tokens > context - len(ids)  # past the end of the context
    assert stats.finish_reason == "length" and stats.context_shifts == 1

    fresh_prompt, t, discard = kept_tokens(ids, out, context, keep)
    assert fresh_prompt[:keep] == ids[:keep]  # the system prompt is still there
    live = engine.slots[0].tokens  # what the engine says its cache holds now
    assert live == fresh_prompt + out[t:-1]
    fresh = Engine(model, prefix_reuse=False, session_cache_mib=0)
    expected, _ = generate(fresh, fresh_prompt, len(out) - t, logprobs=fresh_logprobs)
    assert out[t:] == expected
    # not only the same argmax: the same distribution (up to the float error of other chunking)
    assert max(abs(a - b) for a, b in zip(shifted_logprobs[t:], fresh_logprobs)) < 2e-3

    # the engine's keep comes from the request when --keep is not set (-1)
    hinted = Engine(model, context_shift=True)
    again, stats = generate(hinted, ids, max_tokens, keep=keep)
    assert again == out and stats.context_shifts == 1


def test_shifts_repeat(model, served_model):
    ids, _ = chat_prompt(served_model, "Be verbose.", NOTES[:1800] + " Go on with the log.")
    keep = len(ids) - 40  # a small room after the kept tokens: a shift every few dozen tokens
    engine = Engine(model, context_shift=True, keep=keep, prefill_chunk=64)
    discard = (engine.context_length - keep) // 2
    max_tokens = engine.context_length - len(ids) + 3 * discard
    out, stats = generate(engine, ids, max_tokens)
    assert len(out) == max_tokens and stats.context_shifts == 3
    # the cache the engine describes is what a fresh run on those tokens computes: continuing
    # from it (prefix reuse) gives the tokens a cold engine gives
    live = list(engine.slots[0].tokens)
    assert live[:keep] == ids[:keep] and live[-5:] == out[-6:-1]
    cont, stats = generate(engine, live[:480], 5)
    assert stats.cached_tokens == 479
    cold, _ = generate(Engine(model, prefix_reuse=False, session_cache_mib=0), live[:480], 5)
    assert cont == cold


def test_without_the_flag_the_generation_stops_at_the_end_of_the_context(model, served_model):
    ids, keep = chat_prompt(served_model, "You are a storyteller.", NOTES[:1800] + " Go on.")
    engine = Engine(model, keep=keep)
    out, stats = generate(engine, ids, 10 ** 6)
    assert stats.finish_reason == "length" and stats.context_shifts == 0
    assert len(ids) + len(out) == engine.context_length
    with pytest.raises(ContextLengthError):  # a prompt that fills the context is still refused
        Engine(model, context_shift=True).generate(GenerationRequest([1] * engine.context_length, 5, GREEDY))


def test_cancel_during_generation_past_the_context(model, served_model):
    ids, keep = chat_prompt(served_model, "You are a storyteller.", NOTES[:1800] + " Go on.")
    engine = Engine(model, context_shift=True, keep=keep)
    cancel = CancelToken()
    gen = engine.generate(GenerationRequest(ids, 10 ** 4, GREEDY, frozenset()), cancel)
    for n, _ in enumerate(gen, 1):
        if n == engine.context_length - len(ids) + 5:
            cancel.cancel()
    assert gen.stats.finish_reason == "cancelled" and gen.stats.context_shifts == 1
    assert n == engine.context_length - len(ids) + 5
