"""Anthropic's thinking.budget_tokens bounds the thinking: a model still thinking when the budget
is spent has its thinking closed for it and answers (the real app over the scripted fake model)."""

from __future__ import annotations

import pytest

from fakes.scripted import THINKING_TEMPLATE, FakeModel

@pytest.fixture
def thinker():
    model = FakeModel(template=THINKING_TEMPLATE, max_seq_len=4096)
    # thinks forever, unless the thinking was closed for it: then it answers
    model.script.reply(lambda text: "</think>" in text.rsplit("<|im_start|>assistant", 1)[-1],
                       ["Hi", " there"])
    model.script.default(["Let me see: hmm"], then="repeat")
    yield model
    model.runtime.release()
    model.close()


def body(**kw):
    return {"model": "m", "max_tokens": 3000, "messages": [{"role": "user", "content": "Think, then answer."}],
            **kw}


def test_thinking_stops_at_the_budget_and_the_answer_follows(thinker):
    client = thinker.client()
    r = client.simulate_post("/v1/messages", json=body(thinking={"type": "enabled", "budget_tokens": 1024})).json
    kinds = [b["type"] for b in r["content"]]
    assert kinds == ["thinking", "text"], r
    thought = thinker.encode(r["content"][0]["thinking"])
    assert 1024 <= len(thought) <= 1026, len(thought)  # the budget, and the step the engine was on
    assert r["content"][1]["text"] == "Hi there" and r["stop_reason"] == "end_turn"
    assert 1024 < r["usage"]["output_tokens"] < 1040
    # streamed: the same blocks
    stream = client.simulate_post("/v1/messages", json=body(thinking={"type": "enabled", "budget_tokens": 1024},
                                                            stream=True)).text
    assert "thinking_delta" in stream and '"text": "Hi"' in stream.replace('"text":"Hi"', '"text": "Hi"')
    assert "event: message_stop" in stream


def test_without_a_budget_the_thinking_runs_to_max_tokens(thinker):
    r = thinker.client().simulate_post("/v1/messages", json=body(max_tokens=1500)).json
    assert [b["type"] for b in r["content"]] == ["thinking"] and r["stop_reason"] == "max_tokens"


def test_a_budget_never_cuts_an_answer_the_tool_parser_holds_back():
    """A model that does not think, offered tools: its answer, held back while it may still be a
    fenced JSON call, runs past the budget untouched (it was cut there, and a second generation
    after a spliced-in </think> wrote the reply: 3 characters of 4,000)."""
    from fakes.scripted import TOOLS_TEMPLATE
    model = FakeModel(template=TOOLS_TEMPLATE, max_seq_len=4096)
    answer = ["```json\n{\"items\": [\""] + ["Hello"] * 1100 + ["\"]}\n```"]  # it may yet be a JSON call
    model.script.default(answer)
    # the real model, handed a </think> in its answer's middle, wrote "```" and stopped
    model.script.reply(lambda text: "</think>" in text.rsplit("<|im_start|>assistant", 1)[-1], ["```"])
    tool = {"name": "get_weather", "description": "weather", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    try:
        for stream in (False, True):
            r = model.client().simulate_post("/v1/messages", json=body(
                thinking={"type": "enabled", "budget_tokens": 1024}, tools=[tool], stream=stream))
            assert r.status_code == 200, r.text
            if stream:
                assert r.text.count("Hello") == 1100 and "thinking" not in r.text.replace('"thinking"', "")
                continue
            message = r.json
            assert [b["type"] for b in message["content"]] == ["text"], message["content"]
            assert message["content"][0]["text"].count("Hello") == 1100
            assert message["stop_reason"] == "end_turn" and message["usage"]["output_tokens"] < 1200
    finally:
        model.runtime.release()
        model.close()
