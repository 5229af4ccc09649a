"""Malformed and hostile requests to the Messages API: each gets a quick 4xx in Anthropic's
envelope (never a 500, a hang or OpenAI's shape); the server is unharmed afterwards."""

from __future__ import annotations

import json

import pytest
import requests

OK_MSG = [{"role": "user", "content": "hi"}]
FIELDS = {
    "max_tokens": [-1, 1.5, "16", True, None],  # (0: pre-warming, accepted)
    "temperature": [-0.1, 1.5, "hot", True, [1], 1e400],
    "top_p": [-1, 1.5, "x", False],  # 0 is valid: the best token only
    "top_k": [-1, 1.5, "10", [3]],
    "stop_sequences": ["x", 5, [1, 2], ["x"] * 17, ["y" * 600], {"a": "b"}],
    "stream": ["yes", 1, [True]],
    "system": [5, [5], [{"type": "image"}], [{"type": "text"}], [{"type": "text", "text": 3}], {"text": "x"}],
    "tools": ["x", [1], [{"name": 5}], [{"name": "f"}], [{"name": "f", "input_schema": "x"}],
              [{"name": "", "input_schema": {}}], [{"name": "f" * 200, "input_schema": {}}],
              [{"name": "f", "input_schema": {}}, {"name": "f", "input_schema": {}}], [{"type": 7}],
              [{"name": "f", "input_schema": {}, "description": 3}]],
    "tool_choice": ["auto", {"type": "any"}, {"type": "tool"}, {"type": "tool", "name": "f"}, {"type": "sometimes"},
                    {"type": "auto", "disable_parallel_tool_use": "yes"}, 3],
    "thinking": ["on", {"type": "maybe"}, [1]],
    "output_config": ["x", {"format": "json"}, {"format": {"type": "json_schema"}},
                      {"format": {"type": "json_schema", "schema": {"type": "object", "if": {}}}}],
    "metadata": ["x", {"user_id": 5}, [1]],
    "mcp_servers": [[{"type": "url", "url": "http://x"}]],
    "model": [5, ["a"]],
    "frequency_penalty": [0.5],
    "n": [2],
    "unknown_field": [1],
}
BAD_MESSAGES = [
    None, "hi", 5, [], {}, [None], ["hi"], [{"content": "no role"}], [{"role": "tool", "content": "x"}],
    [{"role": "user"}], [{"role": "user", "content": 5}], [{"role": "user", "content": [5]}],
    [{"role": "user", "content": [{"type": "image", "source": {"type": "nope"}}]}],
    [{"role": "user", "content": [{"type": "document", "source": {}}]}],
    [{"role": "user", "content": [{"text": "no type"}]}], [{"role": "user", "content": [{"type": "text"}]}],
    [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}],
    [{"role": "user", "content": [{"type": "tool_result"}]}],
    [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "is_error": "yes"}]}],
    [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": [{"type": "image"}]}]}],
    [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": 5}]}],
    [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": "{}"}]}],
    [{"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}],
    [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}],
    [{"role": "assistant", "content": [{"type": "thinking"}]}],
    [{"role": "user", "content": [{"type": "server_tool_use"}]}],
    [{"role": "system", "content": "only system"}], [{"role": "system", "content": [{"type": "image"}]}],
    [{"role": "user", "content": "x"}] * 5000, [{"role": ["user"], "content": "x"}],
    [{"role": "user", "content": "word " * 3000}],
]
ANY_FIELD_JUNK = [{"deep": {"er": [1, 2, {"x": None}]}}, "\u0000", "9" * 400]
RAW = [b"", b"{", b"[]", b"null", b'"str"', b"\xff\xfe\x00", b'{"messages": NaN}', b"{" * 10000 + b"}" * 10000,
       b'{"max_tokens": 5, "messages": [{"role": "user", "content": "\\ud800"}]}', b"<xml/>", b"messages=hi"]


def cases():
    for field, values in FIELDS.items():
        junk = ANY_FIELD_JUNK if field in ("temperature", "top_k", "stop_sequences", "tools", "thinking") else []
        for i, value in enumerate(values + junk):
            yield f"{field}-{i}", "/v1/messages", {"max_tokens": 8, "messages": OK_MSG, field: value}
    for i, messages in enumerate(BAD_MESSAGES):
        yield f"messages-{i}", "/v1/messages", {"max_tokens": 8, "messages": messages}
    for i, body in enumerate(RAW):
        yield f"raw-{i}", "/v1/messages", body
    for i, body in enumerate([{}, {"messages": "x"}, {"messages": OK_MSG, "tools": "x"}, [1], b"{",
                              {"messages": [{"role": "user", "content": [{"type": "image"}]}]}]):
        yield f"count_tokens-{i}", "/v1/messages/count_tokens", body
    yield "unknown-subpath", "/v1/messages/batches", {"max_tokens": 8, "messages": OK_MSG}


CASES = list(cases())


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 120


@pytest.fixture(scope="module")
def baseline(server):
    body = {"max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}], "temperature": 0}
    r = requests.post(server.base_url + "/v1/messages", json=body, timeout=120)
    return body, r.json()["content"]


@pytest.mark.parametrize("name, path, body", CASES, ids=[c[0] for c in CASES])
def test_hostile_request_gets_a_4xx_in_anthropics_envelope(server, baseline, name, path, body):
    data = body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode()
    r = requests.post(server.base_url + path, data=data, headers={"Content-Type": "application/json"}, timeout=10)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    doc = r.json()
    assert set(doc) == {"type", "error"} and doc["type"] == "error", doc
    assert set(doc["error"]) == {"type", "message"} and doc["error"]["message"], doc
    assert doc["error"]["type"] in ("invalid_request_error", "not_found_error")
    assert "Traceback" not in r.text and "/work/" not in r.text and ".py" not in r.text


def test_server_unharmed_after_the_corpus(server, baseline):
    body, before = baseline
    after = requests.post(server.base_url + "/v1/messages", json=body, timeout=120).json()
    assert after["content"] == before
    assert requests.get(server.base_url + "/health", timeout=5).json()["status"] == "ok"


def test_extreme_but_valid_sampling_values_are_served(server):
    """Values the spec allows, at its edges: a top_k past the vocabulary and past int32 (the
    C sampler's field) keeps every token; a top_p of 2e-94 keeps the best one. Found by
    schemathesis as a 500 ("invalid sampling parameters")."""
    body = {"max_tokens": 4, "messages": OK_MSG, "top_k": 1262796495732399, "top_p": 2.273149252015718e-94}
    r = requests.post(server.base_url + "/v1/messages", json=body, timeout=120)
    assert r.status_code == 200, r.text[:300]
    greedy = requests.post(server.base_url + "/v1/messages", json={**body, "top_k": 0, "temperature": 0},
                           timeout=120)
    assert r.json()["content"] == greedy.json()["content"]  # top_p 2e-94: the best token each step
