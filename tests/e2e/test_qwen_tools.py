"""Tools and structured output with the default model (Qwen2.5-Coder-0.5B, 8da4w) served for
real: its own Hermes template, our parsers, and constrained decoding where the client demands it."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from .structured import CITY_SCHEMA, assert_valid_calls, json_choices, tool_choices
from .tool_prompts import AGENT_TOOLS, CLEAR_CASES

WEATHER = [t for t in AGENT_TOOLS if t["function"]["name"] == "get_weather"]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in AGENT_TOOLS}


@pytest.fixture(scope="module")
def client(qwen_server):
    return openai.OpenAI(base_url=qwen_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_weather_prompt_becomes_a_tool_call(client, model):
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is the weather in Paris? Use the tool."}],
        tools=WEATHER, temperature=0, max_tokens=80)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] == "Paris"
    assert not choice.message.content


def test_varied_tool_prompts_give_valid_calls(client, model):
    """tool_choice "auto", greedy: the model decides, the parser must catch every call it means."""
    valid, misses = 0, []
    for prompt, expected in CLEAR_CASES:
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                           tools=AGENT_TOOLS, temperature=0, max_tokens=100)
        calls = r.choices[0].message.tool_calls or []
        ok = (r.choices[0].finish_reason == "tool_calls" and len(calls) >= 1
              and calls[0].function.name == expected)
        if ok:
            args = json.loads(calls[0].function.arguments)
            try:
                jsonschema.validate(args, SCHEMAS[expected])
            except jsonschema.ValidationError:
                ok = False
        valid += ok
        if not ok:
            misses.append((prompt, r.choices[0].message.content, [c.function for c in calls]))
    rate = valid / len(CLEAR_CASES)
    print(f"\nvalid tool calls on clear prompts: {valid}/{len(CLEAR_CASES)} ({rate:.0%})")
    for miss in misses:
        print("  miss:", miss)
    # Measured: 14/20 (8da4w) and 15/20 (8da4w + 4-bit embeddings) greedy; misses are wrong or
    # undeclared tool names.
    assert rate >= 0.65, misses


FAN_AND_WEATHER = [
    {"type": "function", "function": {"name": "set_fan", "description": "Set the fan", "strict": True, "parameters": {
        "type": "object", "properties": {"level": {"type": "integer", "minimum": 1, "maximum": 5},
                                         "mode": {"type": "string", "enum": ["eco", "turbo"]}},
        "required": ["level", "mode"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}]


@pytest.mark.parametrize("stream", [False, True])
def test_auto_calls_are_held_to_the_tools_schemas(client, model, stream):
    """tool_choice "auto" (strict or not): the output is free until the model has begun a call to
    one of the tools, then its arguments are held to that tool's schema (app/grammar/lazy.py).
    Free, greedy Qwen 0.5B wrote set_fan {"level": 7.5, "mode": "super"}, {"level": 3, "mode":
    "quiet"} and get_weather {"city": "Rome", "unit": "kelvin"} for these three asks."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in FAN_AND_WEATHER}
    asks = ["Set the fan to level 7.5 in super mode.", "Fan to 3, quiet please", "Weather in Rome in kelvin",
            "Hi! How are you?"]
    found = []
    for ask in asks:
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": ask}],
                                           tools=FAN_AND_WEATHER, temperature=0, max_tokens=80, stream=stream)
        if stream:
            deltas = [c.choices[0].delta for c in r if c.choices]
            names = [d.tool_calls[0].function.name for d in deltas if d.tool_calls and d.tool_calls[0].function.name]
            arguments = "".join(d.tool_calls[0].function.arguments or "" for d in deltas if d.tool_calls)
            content = "".join(d.content or "" for d in deltas)
            calls = [(names[0], arguments)] if names else []
        else:
            message = r.choices[0].message
            content = message.content or ""
            calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
        found.append((ask, calls, content))
    for ask, calls, _ in found[:3]:
        assert len(calls) == 1, found
        jsonschema.validate(json.loads(calls[0][1]), schemas[calls[0][0]])
    assert not found[3][1] and found[3][2].strip(), found[3]  # prose stays free


def test_tool_choice_required_20_of_20(client):
    assert_valid_calls(tool_choices(client, "required", total=20))


def test_named_function_20_of_20(client):
    assert_valid_calls(tool_choices(client, {"type": "function", "function": {"name": "get_weather"}}, total=20),
                       only="get_weather", single=True)


def test_json_schema_strict_50_of_50_validate(client):
    outputs = json_choices(client, {"type": "json_schema", "json_schema": {
        "name": "city", "strict": True, "schema": CITY_SCHEMA}}, total=50)
    for text in outputs:
        jsonschema.validate(json.loads(text), CITY_SCHEMA)


def test_json_object_50_of_50_parse(client):
    for text in json_choices(client, {"type": "json_object"}, total=50):
        assert isinstance(json.loads(text), dict)


def _weather(city: str) -> str:
    return json.dumps({"city": city, "temperature_c": 18, "sky": "cloudy"})


@pytest.mark.parametrize("stream", [False, True])
def test_agent_loop_call_result_answer(client, model, stream):
    """What an agent does: ask, get a call, run it, send the result back, get an answer."""
    messages = [{"role": "user", "content": "What's the weather in Oslo right now?"}]

    def ask(**extra):
        if not stream:
            r = client.chat.completions.create(model=model, messages=messages, tools=WEATHER, temperature=0,
                                               max_tokens=120, **extra)
            return r.choices[0].message, r.choices[0].finish_reason
        content, calls, finish = "", {}, None
        for chunk in client.chat.completions.create(model=model, messages=messages, tools=WEATHER, temperature=0,
                                                    max_tokens=120, stream=True, **extra):
            for c in chunk.choices:
                content += c.delta.content or ""
                for d in c.delta.tool_calls or []:
                    call = calls.setdefault(d.index, {"id": d.id, "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                    call["function"]["name"] += d.function.name or ""
                    call["function"]["arguments"] += d.function.arguments or ""
                finish = c.finish_reason or finish
        return {"content": content, "tool_calls": [calls[i] for i in sorted(calls)]}, finish

    message, finish = ask(tool_choice="required")
    calls = message.tool_calls if not stream else message["tool_calls"]
    assert finish == "tool_calls" and calls
    call = calls[0] if stream else calls[0].model_dump()
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "get_weather" and "oslo" in args["city"].lower()
    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": _weather(args["city"])})

    # The final turn: tools still declared, calls switched off ("none"), as agents do to end a
    # loop. Qwen2.5-Coder-0.5B (8da4w) tends to repeat its call after a tool result rather than
    # use it, so this checks the protocol round trip, not the model's reasoning.
    message, finish = ask(tool_choice="none")
    answer = message.content if not stream else message["content"]
    calls = message.tool_calls if not stream else message["tool_calls"]
    assert finish == "stop" and not calls
    assert answer and answer.strip()
    print(f"\nfinal answer ({'streamed' if stream else 'whole'}): {answer!r}")


OPEN_WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"]}}}]  # no additionalProperties, as most clients write it
OPEN_CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                              "country": {"type": "string", "maxLength": 40}}}


def test_constrained_output_invents_no_keys(client, model):
    """An object schema listing its properties and silent about others is closed to others when
    decoding is constrained (llama.cpp's converter and OpenAI's strict mode do the same): forced
    calls' arguments and json_schema output hold declared keys only, so `fn(**arguments)` works."""
    keys: list[set] = []
    for i, prompt in enumerate(["What is the weather in Paris?", "Tell me about Rome.", "hello"]):
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], tools=OPEN_WEATHER,
            tool_choice="required", n=4, temperature=1.0, seed=300 + i, max_tokens=60)
        for c in r.choices:
            assert c.finish_reason == "tool_calls", c
            keys += [set(json.loads(call.function.arguments)) for call in c.message.tool_calls]
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt + " Answer in JSON."}], n=4,
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": OPEN_CITY}},
            temperature=1.0, seed=400 + i, max_tokens=60)
        keys += [set(json.loads(c.message.content)) for c in r.choices if c.finish_reason == "stop"]
    assert len(keys) >= 16
    assert all(k <= {"city", "country"} for k in keys), keys
