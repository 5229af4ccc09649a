"""The engine on the real model: stops, lengths, cancellation, prefix reuse."""

from __future__ import annotations

import pytest

from app.engine import CancelToken, ContextLengthError, Engine, GenerationRequest, SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def prompt(served_model, text: str) -> list[int]:
    return served_model.tokenizer.encode(served_model.template.render([{"role": "user", "content": text}]))


def run(engine: Engine, ids: list[int], max_tokens: int, cancel: CancelToken | None = None, stops=frozenset({2})):
    gen = engine.generate(GenerationRequest(ids, max_tokens, GREEDY, stops), cancel)
    return [e.token_id for e in gen], gen.stats


def test_length_and_stop(served_model):
    engine = served_model.engine
    ids = prompt(served_model, "Count from 1 to 20.")
    tokens, stats = run(engine, ids, 5, stops=frozenset())
    assert len(tokens) == 5 and stats.finish_reason == "length"
    assert stats.prompt_tokens == len(ids) and stats.completion_tokens == 5
    # stopping on the first token the model emits
    tokens2, stats2 = run(engine, ids, 5, stops=frozenset({tokens[0]}))
    assert tokens2 == tokens[:1] and stats2.finish_reason == "stop"


def test_generation_stops_at_the_end_of_the_context(served_model):
    engine = served_model.engine
    filler = served_model.tokenizer.encode("The sky is blue and the sea is green. ")
    ids = (filler * engine.context_length)[: engine.context_length - 4]
    tokens, stats = run(engine, ids, 10 ** 6, stops=frozenset())
    assert stats.finish_reason == "length"
    assert len(ids) + len(tokens) == engine.context_length
    with pytest.raises(ContextLengthError):
        engine.generate(GenerationRequest([1] * engine.context_length, 1, GREEDY))


def test_cancel_stops_within_one_step(served_model):
    engine = served_model.engine
    ids = prompt(served_model, "Write a poem.")
    cancel = CancelToken()
    gen = engine.generate(GenerationRequest(ids, 100, GREEDY, frozenset()), cancel)
    seen = 0
    for _ in gen:
        seen += 1
        if seen == 3:
            before = engine.forward_calls
            cancel.cancel()
    assert gen.stats.finish_reason == "cancelled"
    assert engine.forward_calls == before
    assert seen == 3


def test_a_prefill_cancelled_part_way_reports_the_time_it_read(served_model):
    """Cancelled between two chunks of its prompt: the stats say how long the part read took
    (the access log's prefill=), not 0."""
    from app.engine import PromptProgress
    engine = served_model.engine
    filler = served_model.tokenizer.encode("The sky is blue and the sea is green. ")
    ids = (filler * engine.context_length)[: engine.context_length - 8]
    saved, engine.prefill_chunk = engine.prefill_chunk, 64
    engine.prefix_reuse = False
    try:
        cancel = CancelToken()
        gen = engine.generate(GenerationRequest(ids, 4, GREEDY, frozenset(), report_progress=True), cancel)
        for event in gen:
            assert isinstance(event, PromptProgress)
            if event.processed > 0:
                cancel.cancel()
    finally:
        engine.prefill_chunk = saved
        engine.prefix_reuse = True
    assert gen.stats.finish_reason == "cancelled" and gen.stats.completion_tokens == 0
    assert gen.stats.prompt_ms > 0


def test_prefix_reuse_gives_the_same_text(served_model):
    engine = served_model.engine
    first = prompt(served_model, "Name a fruit.")
    second = prompt(served_model, "Name a fruit that is red.")
    run(engine, first, 8)  # leaves its tokens in the cache
    warm, warm_stats = run(engine, second, 16)
    assert warm_stats.cached_tokens > 0
    engine.prefix_reuse = False
    try:
        cold, cold_stats = run(engine, second, 16)
    finally:
        engine.prefix_reuse = True
    assert cold_stats.cached_tokens == 0
    assert warm == cold


def test_idle_only_once_a_generation_has_let_go(served_model):
    # what the router waits for before it frees a model's runtime
    engine = served_model.engine
    assert engine.idle and engine.wait_idle(0.1)
    gen = engine.generate(GenerationRequest(prompt(served_model, "Write a poem."), 10, GREEDY, frozenset()))
    next(iter(gen))  # it holds a slot now
    assert not engine.idle
    assert not engine.wait_idle(0.05)
    gen.close()  # as a closed response body does
    assert engine.idle and engine.wait_idle(0.1)
