"""tool_choice and response_format as OpenAI documents them: demanded formats are guaranteed."""

from __future__ import annotations

import json

import pytest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                   "required": ["zone"], "additionalProperties": False}}}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Tell me about a fictional person."}]


def test_named_function_is_called(client, model):
    r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}},
                                       max_tokens=80)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_time"
    assert isinstance(json.loads(call.function.arguments)["zone"], str)


def test_required_gives_a_call(client, model):
    r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], temperature=0,
                                       tool_choice="required", parallel_tool_calls=False, max_tokens=80)
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.tool_calls[0].function.name in ("get_weather", "get_time")


def test_json_schema_output_validates(client, model):
    r = client.chat.completions.create(model=model, messages=ASK, temperature=0, max_tokens=80,
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "person", "strict": True, "schema": SCHEMA}})
    assert r.choices[0].finish_reason == "stop"
    data = json.loads(r.choices[0].message.content)
    assert set(data) == {"name", "age"} and isinstance(data["name"], str) and isinstance(data["age"], int)


def test_json_object_output_parses(client, model):
    r = client.chat.completions.create(model=model, temperature=0, max_tokens=80,
                                       messages=[{"role": "user", "content": 'Reply with a JSON object {"ok": true}.'}],
                                       response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.parametrize("body, param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
])
def test_impossible_demands_are_400(post, model, body, param):
    r = post("/chat/completions", {"model": model, "messages": ASK, "max_tokens": 4, **body})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] in (param, f"{param}.type")
