"""The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens) as Anthropic
documents it, checked black-box with the official anthropic SDK and its types.

The server root is OPENAI_BASE_URL without its `/v1`; the key (OPENAI_API_KEY) goes as x-api-key.
"""

from __future__ import annotations

import json
import os

import pytest
import requests
from pydantic import TypeAdapter

HELLO = [{"role": "user", "content": "Count from one to ten in words, separated by spaces."}]
GREEDY = {"temperature": 0}
WEATHER = {"name": "get_weather", "description": "Current weather in a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"],
    "additionalProperties": False}}


@pytest.fixture(scope="module")
def root(base_url) -> str:
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url


@pytest.fixture(scope="module")
def anthropic_client(root):
    anthropic = pytest.importorskip("anthropic")
    return anthropic.Anthropic(base_url=root, api_key=os.environ.get("OPENAI_API_KEY", "unused"), max_retries=0,
                               timeout=300)


@pytest.fixture(scope="module")
def types():
    from anthropic import types
    return types


def raw(root: str, body, path: str = "/v1/messages", **kw) -> requests.Response:
    headers = {"x-api-key": os.environ.get("OPENAI_API_KEY", "unused"), "anthropic-version": "2023-06-01"}
    return requests.post(root + path, json=body, timeout=300, headers=headers, **kw)


def events(r: requests.Response) -> list[tuple[str, dict]]:
    out, name = [], None
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[len("data: "):])))
            name = None
    return out


def test_message_shape(anthropic_client, root, model, types):
    r = raw(root, {"model": model, "max_tokens": 8, "messages": HELLO, **GREEDY})
    assert r.status_code == 200, r.text
    m = types.Message.model_validate(r.json())
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert m.stop_reason in ("end_turn", "max_tokens") and 0 < m.usage.output_tokens <= 8
    assert m.content and m.content[0].type == "text"


def test_stream_event_sequence(root, model, types):
    r = raw(root, {"model": model, "max_tokens": 8, "messages": HELLO, "stream": True, **GREEDY}, stream=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    seq = events(r)
    adapter = TypeAdapter(types.RawMessageStreamEvent)
    for name, data in seq:
        assert name == data["type"]
        if name != "ping":
            adapter.validate_python(data)
    names = [n for n, _ in seq]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") >= 1
    assert seq[-2][1]["delta"]["stop_reason"] in ("end_turn", "max_tokens")


def test_stream_accumulates_to_the_non_streamed_message(anthropic_client, model):
    whole = anthropic_client.messages.create(model=model, max_tokens=16, messages=HELLO, extra_body=GREEDY)
    with anthropic_client.messages.stream(model=model, max_tokens=16, messages=HELLO, extra_body=GREEDY) as s:
        final = s.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


def test_max_tokens_stop_reason(anthropic_client, model):
    m = anthropic_client.messages.create(model=model, max_tokens=2, messages=HELLO, extra_body=GREEDY)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 2


def test_stop_sequence(anthropic_client, model):
    text = anthropic_client.messages.create(model=model, max_tokens=24, messages=HELLO,
                                            extra_body=GREEDY).content[0].text
    stop = text[len(text) // 2:][:3]  # a piece of the greedy text: the same request stops there
    assert len(stop) == 3, text
    m = anthropic_client.messages.create(model=model, max_tokens=24, messages=HELLO, stop_sequences=[stop],
                                         extra_body=GREEDY)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == text[:text.index(stop)]


def test_count_tokens_matches_usage(anthropic_client, model):
    body = dict(system="Be brief.", messages=[{"role": "user", "content": "Name a colour."}])
    counted = anthropic_client.messages.count_tokens(model=model, **body).input_tokens
    m = anthropic_client.messages.create(model=model, max_tokens=1, extra_body=GREEDY, **body)
    assert counted == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


def test_forced_tool_use(anthropic_client, model):
    m = anthropic_client.messages.create(model=model, max_tokens=60, tools=[WEATHER], extra_body=GREEDY,
                                         tool_choice={"type": "tool", "name": "get_weather"},
                                         messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert m.stop_reason == "tool_use"
    (call,) = [b for b in m.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.id.startswith("toolu_") and isinstance(call.input["city"], str)


def test_errors_are_anthropic_shaped(anthropic_client, root, model, types):
    anthropic = pytest.importorskip("anthropic")
    for body in ({"model": model, "messages": HELLO},  # max_tokens is required
                 {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": [  # no such block
                     {"type": "hologram", "source": {"type": "base64", "data": "AA"}}]}]}):
        r = raw(root, body)
        assert r.status_code == 400, r.text
        err = types.shared.ErrorResponse.model_validate(r.json())
        assert err.error.type == "invalid_request_error" and err.error.message
    with pytest.raises(anthropic.BadRequestError):
        anthropic_client.messages.create(model=model, max_tokens=4, messages=[])
