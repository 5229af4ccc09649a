"""Shared requests and checks for the constrained-decoding tests (tool_choice, response_format)."""

from __future__ import annotations

import json

import jsonschema
import requests

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount between two currencies",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number", "minimum": 0, "maximum": 1000000},
            "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "to": {"type": "string", "pattern": "^[A-Z]{3}$"}},
            "required": ["amount", "from", "to"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
    },
    "required": ["city", "country", "population"],
    "additionalProperties": False,
}

PROMPTS = [
    "Tell me about Paris.",
    "How much is 250 US dollars in euros?",
    "I'm flying to Tokyo tomorrow, anything I should know?",
    "Describe a city you like.",
    "hello",
]
# json_object has no schema to end the output: ask for something small, as a client would.
OBJECT_PROMPTS = [
    'Give me a JSON object with the keys "name" and "age" for a fictional person.',
    'Return a JSON object {"answer": ...} with the capital of Italy.',
    'Reply with a JSON object with a key "colors" listing two colors.',
    'Make a JSON object with keys "x" and "y", both small numbers.',
    'Give a JSON object {"ok": true}.',
]


def _model(client) -> str:
    return client.models.list().data[0].id


def json_choices(client, response_format: dict, *, total: int, n: int = 5) -> list[str]:
    """`total` sampled outputs (n per request, varied prompts and seeds); all must end with "stop"."""
    out: list[str] = []
    model = _model(client)
    free = response_format["type"] == "json_object"
    prompts = OBJECT_PROMPTS if free else PROMPTS
    # A free-form object only ends when the model closes it: sample less wildly than for a schema.
    temperature = 0.5 if free else 0.8
    for i in range(total // n):
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompts[i % len(prompts)]}],
            response_format=response_format, n=n, temperature=temperature, seed=100 + i, max_tokens=160)
        for c in r.choices:
            assert c.finish_reason == "stop", c
            out.append(c.message.content)
    return out


def tool_choices(client, tool_choice, *, total: int, n: int = 5, parallel: bool = False) -> list:
    """`total` sampled outputs; one call each unless `parallel` (small models repeat calls
    until max_tokens when allowed several)."""
    out = []
    model = _model(client)
    for i in range(total // n):
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=parallel, n=n, temperature=0.8,
            seed=200 + i, max_tokens=120)
        out.extend(r.choices)
    return out


def assert_valid_calls(choices, *, only: str | None = None, single: bool = False) -> None:
    for c in choices:
        assert c.finish_reason == "tool_calls", c
        calls = c.message.tool_calls
        assert calls, c
        if single:
            assert len(calls) == 1, c
        for call in calls:
            assert call.type == "function" and call.id.startswith("call_")
            if only:
                assert call.function.name == only
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def collect_stream(server, body: dict) -> dict:
    """Content, tool calls (assembled from their deltas) and finish reason of a streamed request."""
    r = requests.post(server.base_url + "/v1/chat/completions", json={**body, "stream": True},
                      stream=True, timeout=300)
    assert r.status_code == 200, r.text
    content, calls, finish = "", {}, None
    for line in r.iter_lines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for d in delta.get("tool_calls") or []:
                call = calls.setdefault(d["index"], {"id": d.get("id"), "function": {"name": "", "arguments": ""}})
                call["function"]["name"] += d.get("function", {}).get("name") or ""
                call["function"]["arguments"] += d.get("function", {}).get("arguments") or ""
            finish = choice["finish_reason"] or finish
    return {"content": content, "tool_calls": [calls[i] for i in sorted(calls)], "finish_reason": finish}
