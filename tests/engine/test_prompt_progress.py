"""PromptProgress events while a prompt is read (issue 13, item 4), on the real model."""

from __future__ import annotations

import math

import pytest

from app.engine import GenerationRequest, PromptProgress, SamplingParams, TokenEvent

GREEDY = SamplingParams(temperature=0.0)


def long_prompt(served_model, text: str, n: int) -> list[int]:
    ids = served_model.tokenizer.encode(text * 200)
    return ids[:n]


def split(events):
    progress = [e for e in events if isinstance(e, PromptProgress)]
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert len(progress) + len(tokens) == len(events)
    return progress, tokens


def check_progress(progress, total, cached, chunk):
    assert progress, "no progress events"
    assert all(p.total == total and p.cache == cached for p in progress)
    assert progress[0].processed == cached  # the first says what the cache already held
    steps = [p.processed for p in progress]
    assert steps == sorted(set(steps)), f"not strictly increasing: {steps}"
    assert steps[-1] == total
    assert len(progress) == 1 + math.ceil((total - cached) / chunk)
    assert all(b - a <= chunk for a, b in zip(steps, steps[1:]))
    times = [p.time_ms for p in progress]
    assert times == sorted(times) and all(isinstance(t, int) for t in times)


@pytest.fixture
def whole_chunks(served_model):
    """Prompts read in whole --prefill-chunk steps: on a loaded host a 128-token step can take
    longer than --prefill-step-ms, and the chunks would shrink (what test_slots checks)."""
    engine = served_model.engine
    saved, engine.prefill_step_s = engine.prefill_step_s, 0
    yield engine
    engine.prefill_step_s = saved


def test_progress_events_come_before_the_first_token_and_end_at_total(served_model, whole_chunks):
    engine = served_model.engine
    ids = long_prompt(served_model, "Zebras graze on the savanna while lions sleep nearby. ", 450)
    gen = engine.generate(GenerationRequest(ids, 4, GREEDY, frozenset(), report_progress=True))
    events = list(gen)
    progress, tokens = split(events)
    assert len(tokens) == 4 and events[-4:] == tokens  # every progress event before the first token
    check_progress(progress, len(ids), gen.stats.cached_tokens, engine.prefill_chunk)
    assert engine.prompt_progress is None  # cleared once the prompt is read

    # the same prompt grown: most of it comes from the cache, and the first event says so
    longer = ids + long_prompt(served_model, "Then it rains. ", 40)
    gen = engine.generate(GenerationRequest(longer, 2, GREEDY, frozenset(), report_progress=True))
    progress, tokens = split(list(gen))
    assert gen.stats.cached_tokens >= len(ids) - 1
    check_progress(progress, len(longer), gen.stats.cached_tokens, engine.prefill_chunk)
    assert len(progress) == 2


def test_without_the_flag_only_tokens_come_and_they_are_the_same(served_model):
    engine = served_model.engine
    ids = long_prompt(served_model, "Kettles whistle when the water boils in the kitchen. ", 300)
    with_progress = list(engine.generate(GenerationRequest(ids, 6, GREEDY, frozenset(), report_progress=True)))
    engine.generate(GenerationRequest([7, 8, 9], 1, GREEDY)).close()
    plain = list(engine.generate(GenerationRequest(ids, 6, GREEDY, frozenset())))
    assert all(isinstance(e, TokenEvent) for e in plain)
    assert [e.token_id for e in plain] == [e.token_id for e in split(with_progress)[1]]


def test_the_engine_shows_the_running_prefill(served_model):
    engine = served_model.engine
    ids = long_prompt(served_model, "Owls hunt at night across the quiet fields. ", 400)
    seen = []
    gen = engine.generate(GenerationRequest(ids, 1, GREEDY, frozenset(), report_progress=True))
    for event in gen:
        if isinstance(event, PromptProgress) and event.processed < event.total:
            seen.append(engine.prompt_progress)  # what /health reads between two chunks
    assert seen and all(s is not None for s in seen)
    assert [s.processed for s in seen] == sorted({s.processed for s in seen})
    assert engine.prompt_progress is None


def test_a_prompt_waiting_for_its_first_step_counts_its_own_time(served_model, monkeypatch):
    """/health read a slot's prompt time from its previous request until the new one's first step
    (113 s shown 0.8 s after a request arrived, under load)."""
    import time

    engine = served_model.engine
    ids = long_prompt(served_model, "Owls hunt at night across the quiet fields. ", 40)
    list(engine.generate(GenerationRequest(ids, 1, GREEDY, frozenset())))  # the slot's request before
    time.sleep(0.5)
    seen = []
    real = engine._with_step

    def spy(slot, claim, cancel, fn, *args):
        if fn == engine._prepare:  # marked as reading, its first step not yet run: what /health may see
            seen.append(engine.prompt_progress)
        return real(slot, claim, cancel, fn, *args)

    monkeypatch.setattr(engine, "_with_step", spy)
    list(engine.generate(GenerationRequest(ids[::-1], 1, GREEDY, frozenset())))
    assert seen and seen[0] is not None and seen[0].time_ms < 250, seen
