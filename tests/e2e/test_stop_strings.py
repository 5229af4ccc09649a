"""Stop strings and cut-offs on the real model, over HTTP: a multi-byte stop, with logprobs, with
n > 1, usage after a stop, and JSON cut off by max_tokens under response_format. (The same cases
with scripted tokens, cut exactly where the tests want them, are in tests/hermetic.)"""

from __future__ import annotations

import json

import pytest
import requests

CAFE = [{"role": "user", "content": "Write the French word for coffee, café, three times."}]


def post(server, body: dict) -> dict:
    r = requests.post(server.base_url + "/v1/chat/completions", json={"temperature": 0, **body}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def stream(server, body: dict) -> list[dict]:
    r = requests.post(server.base_url + "/v1/chat/completions", timeout=300, stream=True,
                      json={"temperature": 0, "stream": True, "stream_options": {"include_usage": True}, **body})
    assert r.status_code == 200, r.text
    lines = [line for line in r.iter_lines() if line.startswith(b"data: ")]
    assert lines[-1] == b"data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


@pytest.fixture(scope="module")
def free_text(server) -> tuple[str, int]:
    """The greedy answer without a stop, and its token count."""
    body = post(server, {"messages": CAFE, "max_tokens": 24})
    text = body["choices"][0]["message"]["content"]
    assert "é" in text, text  # the multi-byte character the stop below cuts at
    return text, body["usage"]["completion_tokens"]


def test_a_multibyte_stop_with_logprobs_and_n(server, free_text):
    text, free_tokens = free_text
    stop = text[text.index("é"):text.index("é") + 3]  # "é" and what follows: spans tokens
    cut = text[:text.index(stop)]
    body = post(server, {"messages": CAFE, "max_tokens": 24, "stop": [stop], "n": 2, "logprobs": True})
    for choice in body["choices"]:
        assert choice["message"]["content"] == cut and choice["finish_reason"] == "stop"
        tokens = "".join(t["token"] for t in choice["logprobs"]["content"])
        assert tokens.startswith(cut) and len(tokens.encode()) <= len((cut + stop).encode()) + 8
    # usage: both choices, each up to the token that completed the stop, never the whole free answer
    per_choice = body["usage"]["completion_tokens"] / 2
    assert 0 < per_choice < free_tokens
    chunks = stream(server, {"messages": CAFE, "max_tokens": 24, "stop": [stop], "n": 2})
    for index in (0, 1):
        streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                           if c["choices"] and c["choices"][0]["index"] == index)
        assert streamed == cut
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == ["stop", "stop"]
    assert chunks[-1]["usage"]["completion_tokens"] == body["usage"]["completion_tokens"]


def test_json_cut_off_by_max_tokens_under_response_format(server):
    schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
    body = {"messages": [{"role": "user", "content": "Tell a long story as JSON."}], "max_tokens": 6,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
    whole = post(server, body)
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "length" and whole["usage"]["completion_tokens"] == 6
    text = choice["message"]["content"]
    assert text.lstrip().startswith("{")
    with pytest.raises(ValueError):
        json.loads(text)  # cut off: finish_reason "length" says so
    chunks = stream(server, body)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == text
    assert chunks[-1]["usage"]["completion_tokens"] == 6
