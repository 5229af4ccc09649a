"""llama.cpp's return_progress on streamed chat and completions: prompt_progress chunks while the
prompt is read (before any text), processed rising from the cached part to the whole prompt."""

from __future__ import annotations

import pytest

from fakes.scripted import FakeModel

from .sse import content, events

LONG = "Hello " + "word " * 40  # several prefill chunks of 8 tokens


@pytest.fixture
def fake():
    model = FakeModel(settings={"ETSERVE_PREFILL_CHUNK": "8"})
    model.script.reply("Hello", ["Hi", " there"])
    yield model
    model.runtime.release()
    model.close()


def progress_of(chunks):
    return [c["prompt_progress"] for c in chunks if "prompt_progress" in c]


def check_progress(chunks, text_of):
    progress = progress_of(chunks)
    assert len(progress) >= 3, progress
    first_text = next(i for i, c in enumerate(chunks) if text_of(c))
    assert all("prompt_progress" not in c for c in chunks[first_text:])  # all of it before the text
    total = progress[0]["total"]
    assert progress[0]["processed"] == progress[0]["cache"]
    assert [p["processed"] for p in progress] == sorted(p["processed"] for p in progress)
    assert progress[-1]["processed"] == total and all(p["total"] == total for p in progress)
    return progress


def test_chat_stream_reports_prompt_progress(fake):
    client = fake.client()
    body = {"messages": [{"role": "user", "content": LONG}], "stream": True, "return_progress": True}
    chunks = events(client.simulate_post("/v1/chat/completions", json=body).text)
    progress = check_progress(chunks, lambda c: c["choices"] and c["choices"][0]["delta"].get("content"))
    assert content(chunks) == "Hi there"
    # the same prompt again: all but its last token come from the cache
    again = progress_of(events(client.simulate_post("/v1/chat/completions", json=body).text))
    assert again[0]["cache"] == again[0]["total"] - 1 and again[-1]["processed"] == again[-1]["total"]
    assert progress[0]["total"] == again[0]["total"]


def test_completions_stream_reports_prompt_progress(fake):
    body = {"prompt": LONG, "stream": True, "return_progress": True, "max_tokens": 5}
    chunks = events(fake.client().simulate_post("/v1/completions", json=body).text)
    check_progress(chunks, lambda c: c["choices"] and c["choices"][0]["text"])


@pytest.mark.parametrize("body", [
    {"stream": True},  # not asked for
    {"return_progress": True},  # asked for, but not streamed: llama.cpp reports it only in streams
])
def test_no_progress_unless_a_stream_asks(fake, body):
    r = fake.client().simulate_post("/v1/chat/completions", json={"messages": [{"role": "user", "content": LONG}],
                                                                  **body})
    assert r.status_code == 200
    assert "prompt_progress" not in r.text
