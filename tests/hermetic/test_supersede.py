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


def test_another_documents_completion_from_the_same_client_is_left_alone():
    """Two editor windows on one machine (one address, one User-Agent, one key) each complete their
    own file: neither cuts the other off. Typing on in one document still supersedes."""
    fake = FakeModel()
    engine = fake.engine
    fake.script.default(["x"] * 50)
    key = "editor:same-machine"

    def generation(text: str):
        prompt = fake.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
        cancel = CancelToken(supersede_key=key)
        return engine.generate(GenerationRequest(prompt, 40, SamplingParams(temperature=0), frozenset({fake.eos_id})),
                               cancel), cancel

    quicksort = "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n    pivot = arr[0]\n    "
    stack = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n        "
    a, a_cancel = generation(quicksort)
    fake.runtime.hold()
    try:
        a_run = Background(lambda: list(a))
        wait_for(lambda: fake.runtime.forwards_started == 1)
        b, b_cancel = generation(stack)  # the other window's document
        assert not a_cancel.cancelled
        b_run = Background(lambda: list(b))
        a2, _ = generation(quicksort + "left = ")  # typing on in the first document
        assert a_cancel.cancelled and not b_cancel.cancelled
        a2_run = Background(lambda: list(a2))
    finally:
        fake.runtime.release()
    a_run.result(), b_run.result(), a2_run.result()
    assert b.stats.finish_reason in ("stop", "length") and a2.stats.finish_reason in ("stop", "length")
    assert engine.superseded == 1


def test_same_document():
    from app.engine.engine import same_document

    doc = list(range(100, 400))
    typed = doc[:150] + [7, 8, 9] + doc[150:]  # three tokens typed at the cursor
    assert same_document(doc, typed)
    assert same_document(doc, doc[:150] + doc[152:])  # two deleted
    assert not same_document(doc, list(range(1000, 1300)))
    assert not same_document(doc[:40] + list(range(1000, 1260)), doc)  # a shared header only
