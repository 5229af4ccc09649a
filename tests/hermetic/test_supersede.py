"""An editor's next completion supersedes the one in flight: same key, the older is cancelled at
its next step and the newer takes its slot (its KV prefix with it)."""

from __future__ import annotations

from fakes.scripted import FakeModel

from app.engine import CancelToken, GenerationRequest, SamplingParams

from .background import Background, wait_for


def test_a_newer_request_with_the_same_key_cancels_the_older_and_takes_its_slot():
    fake = FakeModel()
    engine = fake.engine
    fake.script.default(["x"] * 50)

    def generation(text: str, key: str | None):
        prompt = fake.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
        cancel = CancelToken(supersede_key=key)
        return engine.generate(GenerationRequest(prompt, 40, SamplingParams(temperature=0), frozenset({fake.eos_id})),
                               cancel), cancel

    other, _ = generation("another client's request", "infill:client-b")
    old, old_cancel = generation("def f(x):\n    return", "infill:client-a")
    fake.runtime.hold()
    try:
        old_run = Background(lambda: list(old))  # its prompt's step is under way (held)
        wait_for(lambda: fake.runtime.forwards_started == 1)
        old_slot = old.stats.slot
        other_run = Background(lambda: list(other))  # another client's: waits for the step
        new, _ = generation("def f(x):\n    return x", "infill:client-a")
        assert old_cancel.cancelled and old_cancel.reason == "superseded by a newer request"
        new_run = Background(lambda: list(new))
        assert not other.stats.finish_reason
    finally:
        fake.runtime.release()
    old_run.result(), other_run.result(), new_run.result()
    assert old.stats.finish_reason == "cancelled" and old.stats.completion_tokens < 40
    assert new.stats.finish_reason in ("stop", "length") and new.stats.slot == old_slot
    assert new.stats.cached_tokens > 0  # the older request's prompt, already in its slot
    assert other.stats.finish_reason in ("stop", "length")  # another key: untouched
    assert engine.superseded == 1


def test_without_a_key_nothing_is_superseded():
    fake = FakeModel()
    engine = fake.engine
    runs = []
    fake.runtime.hold()
    try:
        for text in ("one", "two"):
            prompt = fake.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
            gen = engine.generate(GenerationRequest(prompt, 3, SamplingParams(temperature=0)), CancelToken())
            runs.append((gen, Background(lambda gen=gen: list(gen))))
        wait_for(lambda: sum(s.busy for s in engine.slots) == 2)
    finally:
        fake.runtime.release()
    for gen, run in runs:
        run.result()
        assert gen.stats.finish_reason in ("stop", "length")
    assert engine.superseded == 0


def test_a_requests_own_choices_never_supersede_each_other():
    """llama.vscode's n_cmpl alternatives are several generations of one request, with its key."""
    fake = FakeModel(fim=True)
    client = fake.client()
    r = client.simulate_post("/infill", json={"input_prefix": "def f(x):\n    ", "input_suffix": "\n",
                                              "n_predict": 4, "n_cmpl": 3, "temperature": 0.5, "seed": 1})
    assert r.status_code == 200, r.text
    assert isinstance(r.json, list) and len(r.json) == 3
    assert all(c["stop"] and c["stop_type"] != "none" for c in r.json), r.json
    assert fake.engine.superseded == 0


def test_the_choices_of_one_fim_completion_never_supersede_each_other():
    fake = FakeModel(fim=True)
    client = fake.client()
    for stream in (False, True):
        r = client.simulate_post("/v1/completions", json={"prompt": "def f(x):\n    ", "suffix": "\n", "n": 3,
                                                          "max_tokens": 4, "temperature": 0.5, "stream": stream})
        assert r.status_code == 200, r.text
        if not stream:
            assert all(c["finish_reason"] in ("stop", "length") for c in r.json["choices"]), r.json
    assert fake.engine.superseded == 0
