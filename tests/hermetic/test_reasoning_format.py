"""llama.cpp's reasoning_format on chat completions: "auto" (the default) puts a thinking model's
thoughts in reasoning_content; "none" leaves them in the content as written (llama.cpp's web UI
sends it when its reasoning parsing is turned off). The real app over the scripted fake model."""

from __future__ import annotations

import pytest

from fakes.scripted import THINKING_TEMPLATE, FakeModel

@pytest.fixture
def thinker():
    model = FakeModel(template=THINKING_TEMPLATE, max_seq_len=4096)
    model.script.default(["Let me see.", "</think>", "\n\n", "Blue."])
    yield model
    model.runtime.release()
    model.close()


def ask(client, **kw):
    return client.simulate_post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Sky colour?"}], "max_tokens": 64, **kw}).json


@pytest.mark.parametrize("fmt", [None, "auto", "deepseek"])
def test_thoughts_go_to_reasoning_content(thinker, fmt):
    r = ask(thinker.client(), **({"reasoning_format": fmt} if fmt else {}))
    message = r["choices"][0]["message"]
    assert message["reasoning_content"] == "Let me see." and message["content"] == "Blue."


def test_none_leaves_them_in_the_content(thinker):
    message = ask(thinker.client(), reasoning_format="none")["choices"][0]["message"]
    assert "reasoning_content" not in message or not message["reasoning_content"]
    assert message["content"] == "Let me see.</think>\n\nBlue."
