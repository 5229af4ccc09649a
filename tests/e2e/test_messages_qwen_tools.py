"""Tool use through the Messages API on the default model (Qwen2.5-Coder-0.5B and its Hermes
template), with the official anthropic SDK: forced calls are enforced by grammar, streamed
input_json_delta fragments are the final input, and a tool_use -> tool_result turn completes."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from .structured import PROMPTS, TOOLS

ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]
SCHEMAS = {t["name"]: t["input_schema"] for t in ANTHROPIC_TOOLS}
EVENTS = TypeAdapter(RawMessageStreamEvent)


@pytest.fixture(scope="module")
def client(qwen_server):
    return anthropic.Anthropic(base_url=qwen_server.base_url, api_key="unused", max_retries=0, timeout=300)


def streamed(client, **kw) -> tuple[Message, dict[int, str]]:
    """The SDK's final message, and each block's input_json_delta fragments joined."""
    fragments: dict[int, str] = {}
    with client.messages.stream(**kw) as stream:
        for event in stream:
            if event.type in ("message_start", "content_block_start", "content_block_delta", "content_block_stop",
                              "message_delta", "message_stop"):
                EVENTS.validate_python(event.model_dump())
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                fragments[event.index] = fragments.get(event.index, "") + event.delta.partial_json
        return stream.get_final_message(), fragments


def test_forced_tool_use_50_of_50_validate_and_stream_their_input(client):
    """tool_choice any / tool, sampled (temperature 1) over varied prompts, half of them streamed:
    every answer is exactly one tool_use whose input validates against its input_schema."""
    names = list(SCHEMAS)
    valid, streamed_calls, truncated = 0, 0, 0
    for i in range(50):
        choice = {"type": "any", "disable_parallel_tool_use": True} if i % 2 == 0 \
            else {"type": "tool", "name": names[(i // 2) % len(names)]}
        kw = dict(model="m", max_tokens=160, tools=ANTHROPIC_TOOLS, tool_choice=choice,
                  messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], extra_body={"temperature": 1.0})
        if i % 4 >= 2:
            message, fragments = streamed(client, **kw)
        else:
            message, fragments = client.messages.create(**kw), None
        Message.model_validate(message.model_dump())
        if message.stop_reason == "max_tokens":
            # A sampled string argument that never closes (rare at temperature 1 with a 0.5B
            # model; the grammar cannot end it): a clean stop at the limit, at most twice.
            assert message.usage.output_tokens == kw["max_tokens"], message.usage
            truncated += 1
            continue
        assert message.stop_reason == "tool_use", message
        (block,) = message.content
        assert block.type == "tool_use" and block.id.startswith("toolu_")
        if choice["type"] == "tool":
            assert block.name == choice["name"]
        jsonschema.validate(block.input, SCHEMAS[block.name])
        if fragments is not None:
            assert json.loads(fragments[0]) == block.input
            streamed_calls += 1
        valid += 1
    assert valid + truncated == 50 and truncated <= 2 and streamed_calls >= 22, (valid, truncated, streamed_calls)


def _weather(city: str) -> str:
    return json.dumps({"city": city, "temperature_c": 18, "sky": "cloudy"})


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_then_tool_result_round_trip(client, stream):
    """Ask, get a tool_use, run it, send the tool_result back, get a text answer."""
    messages = [{"role": "user", "content": "What's the weather in Oslo right now?"}]

    def ask(**kw):
        kw = dict(model="m", max_tokens=120, tools=ANTHROPIC_TOOLS, messages=messages,
                  extra_body={"temperature": 0}, **kw)
        return streamed(client, **kw)[0] if stream else client.messages.create(**kw)

    first = ask(tool_choice={"type": "tool", "name": "get_weather"})
    assert first.stop_reason == "tool_use"
    call = next(b for b in first.content if b.type == "tool_use")
    assert "oslo" in call.input["city"].lower()
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]})
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "content": _weather(call.input["city"])}]})
    # Qwen2.5-Coder-0.5B tends to repeat its call after a result: switch calls off for the answer,
    # as agents do to end a loop; this checks the protocol round trip, not the model's reasoning.
    answer = ask(tool_choice={"type": "none"})
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text.strip()
    print(f"\nanswer ({'streamed' if stream else 'whole'}): {answer.content[0].text!r}")
