"""The Responses API (POST /v1/responses) as OpenAI documents it, checked black-box on real output."""

from __future__ import annotations

import json
import os

import pytest
import requests

WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def auth_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', 'unused')}"}


def stream_events(base_url: str, body: dict) -> list[dict]:
    with requests.post(base_url + "/responses", json={**body, "stream": True}, stream=True, timeout=300,
                       headers=auth_headers()) as r:
        assert r.status_code == 200, r.text[:500]
        names, out = [], []
        for line in r.iter_lines(decode_unicode=True):
            if line.startswith("event: "):
                names.append(line[7:])
            elif line.startswith("data: "):
                out.append(json.loads(line[6:]))
    assert names == [e["type"] for e in out]
    return out


def test_basic_shape(client, model):
    r = client.responses.create(model=model, input="Count from one to ten in words.", max_output_tokens=8,
                                temperature=0)
    assert r.object == "response" and r.id and r.created_at > 0
    assert r.status in ("completed", "incomplete") and r.output[0].type == "message"
    assert r.output[0].role == "assistant" and r.output[0].content[0].type == "output_text"
    assert r.output_text == r.output[0].content[0].text
    u = r.usage
    assert u.input_tokens > 0 and 0 < u.output_tokens <= 8 and u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens >= 0 and u.output_tokens_details.reasoning_tokens >= 0


def test_max_output_tokens_gives_incomplete(client, model):
    r = client.responses.create(model=model, input="Count from one to fifty in words.", max_output_tokens=3,
                                temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3


def test_stream_events_validate_and_add_up(base_url, model):
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    adapter = TypeAdapter(ResponseStreamEvent)
    events = stream_events(base_url, {"model": model, "input": "Say hello.", "max_output_tokens": 12,
                                      "temperature": 0})
    for n, e in enumerate(events):
        adapter.validate_python(e)
        assert e["sequence_number"] == n
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == events[-1]["response"]["output_text"]
    for k in ("response.output_item.added", "response.content_part.added", "response.output_text.done",
              "response.content_part.done", "response.output_item.done"):
        assert k in kinds, k


def test_sdk_stream_helper(client, model):
    """The SDK's stream helper accumulates every event (it raises on one it cannot place)."""
    with client.responses.stream(model=model, input="Say hello.", max_output_tokens=40, temperature=0) as s:
        events = list(s)
        last = events[-1]
        assert last.type in ("response.completed", "response.incomplete")
        if last.type == "response.completed":  # the helper's final response needs a completed one
            assert s.get_final_response().output_text == last.response.output_text
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == last.response.output_text and last.response.usage.output_tokens > 0


def test_previous_response_id_and_retrieve(client, model):
    first = client.responses.create(model=model, input="My name is Ada.", max_output_tokens=8, temperature=0)
    second = client.responses.create(model=model, previous_response_id=first.id, input="What is my name?",
                                     max_output_tokens=8, temperature=0)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert client.responses.retrieve(first.id).id == first.id
    client.responses.delete(first.id)
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_unknown_id_is_404_envelope(base_url):
    r = requests.get(base_url + "/responses/resp_does_not_exist", timeout=30, headers=auth_headers())
    assert r.status_code == 404
    assert {"message", "type", "param", "code"} <= set(r.json()["error"])


def test_forced_function_call(client, model):
    r = client.responses.create(model=model, input="What is the weather in Paris?", tools=[WEATHER],
                                tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60,
                                temperature=0)
    calls = [i for i in r.output if i.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    assert isinstance(json.loads(calls[0].arguments)["city"], str)


def test_function_call_output_round_trip(client, model):
    r = client.responses.create(model=model, max_output_tokens=16, temperature=0, tools=[WEATHER], input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 24 C."}], tool_choice="none")
    assert r.output[0].type == "message" and r.usage.output_tokens > 0


def test_unknown_parameter_is_refused_by_name(post, model):
    r = post("/responses", {"model": model, "input": "hi", "frobnicate": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "frobnicate"


def test_hosted_tool_types_are_accepted(post, model):
    r = post("/responses", {"model": model, "input": "hi", "max_output_tokens": 2,
                            "tools": [WEATHER, {"type": "web_search"}]})
    assert r.status_code == 200, r.text
