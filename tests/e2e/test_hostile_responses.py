"""Malformed and hostile requests to /v1/responses (and /v1/responses/{id}): each gets a 4xx in the
OpenAI envelope quickly, streamed or not; the server is unharmed afterwards."""

from __future__ import annotations

import json

import pytest
import requests

FIELDS = {
    "input": [None, 5, True, {}, [None], ["hi"], [5], [{}], [{"role": "wizard", "content": "x"}],
              [{"role": "user"}], [{"role": "user", "content": 5}], [{"role": "user", "content": [5]}],
              [{"role": "user", "content": [{"type": "input_text"}]}],
              [{"type": "function_call"}], [{"type": "function_call", "call_id": "c", "name": "f", "arguments": 5}],
              [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}],
              [{"type": "function_call", "call_id": 5, "name": "f", "arguments": "{}"}],
              [{"type": "function_call_output", "output": "x"}],
              [{"type": "function_call_output", "call_id": "c", "output": 5}],
              [{"type": "reasoning", "summary": "x"}], [{"type": "reasoning", "summary": [5]}],
              [{"type": "item_reference", "id": "msg_1"}], [{"type": "computer_call_output"}],
              [{"type": 7}], [{"role": "user", "content": "x"}] * 5000, [{"role": "system", "content": "only"}],
              "word " * 3000],
    "instructions": [5, ["x"], {"a": 1}],
    "max_output_tokens": [0, -1, 1.5, "16", True],  # (10 ** 30: cut to the context, accepted)
    "temperature": [-0.1, 2.5, "hot", [1], 1e400],
    "top_p": [-1, 1.5, "x"],  # 0 is valid: the best token only
    "stream": ["yes", 1],
    "tools": ["x", [1], [{"name": "f"}], [{"type": "function"}], [{"type": "function", "name": 5}],
              [{"type": "function", "name": "f", "parameters": "x"}],
              [{"type": "function", "name": "f", "description": 5}]],
    "tool_choice": ["required", "sometimes", 3, {"type": "function"}, {"type": "function", "name": "nope"},
                    {"type": "web_search"}, {"type": "allowed_tools", "tools": []}],
    "parallel_tool_calls": ["yes", 1],
    "text": ["x", {"format": {"type": "xml"}}, {"format": "json"}, {"format": {"type": "json_schema"}},
             {"format": {"type": "json_schema", "schema": {"type": "object", "if": {}}}},
             {"format": {"type": "json_schema", "schema": {}, "strict": "yes"}}],
    "reasoning": ["high", [1]],
    "store": ["yes", 0],
    "previous_response_id": [5, "resp_nope", ""],
    "metadata": ["x", [1]],
    "prompt_cache_key": [5, "", "k" * 200],
    "truncation": ["sometimes", 5],
    "include": ["x", [5]],
    "background": [True],
    "conversation": ["conv_1"],
    "top_logprobs": [-1, 21, "3"],
    "model": [5, ["a"]],
    "unknown_field": [1],
}
ANY_FIELD_JUNK = [{"deep": {"er": [1, 2, {"x": None}]}}, "\u0000", "9" * 400]
SKIP_JUNK = ("input", "model", "metadata", "reasoning", "previous_response_id", "prompt_cache_key", "text",
             "instructions", "tool_choice", "conversation", "truncation")


def cases():
    for field, values in FIELDS.items():
        junk = [] if field in SKIP_JUNK else ANY_FIELD_JUNK
        for i, value in enumerate(values + junk):
            body = {"input": "hi", field: value}
            yield f"{field}-{i}", body
            if field not in ("stream", "input"):
                yield f"{field}-{i}-stream", {**body, "stream": True}
    raw = [b"", b"{", b"[]", b"null", b'"str"', b'{"input": NaN}', b"{" * 10000 + b"}" * 10000,
           b'{"input": "\xc3\x28"}', b"\x00" * 100, b'{"a":' * 200 + b"1" + b"}" * 200]
    for i, body in enumerate(raw):
        yield f"raw-{i}", body


CASES = list(cases())


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 150


@pytest.fixture(scope="module")
def baseline(server):
    body = {"input": "Say hello.", "max_output_tokens": 8, "temperature": 0, "store": False}
    return body, requests.post(server.base_url + "/v1/responses", json=body, timeout=120).json()["output_text"]


def assert_envelope(r: requests.Response) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert "Traceback" not in r.text and "/work/" not in r.text and ".py" not in r.text


@pytest.mark.parametrize("name, body", CASES, ids=[c[0] for c in CASES])
def test_hostile_request_gets_a_4xx_envelope(server, baseline, name, body):
    data = body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode()
    r = requests.post(server.base_url + "/v1/responses", data=data, headers={"Content-Type": "application/json"},
                      timeout=10)
    assert_envelope(r)


@pytest.mark.parametrize("method", ["get", "delete"])
@pytest.mark.parametrize("response_id", ["resp_nope", "x" * 300, "%00", "..%2F..%2Fetc", "'; DROP"])
def test_unknown_stored_ids_are_404(server, method, response_id):
    r = getattr(requests, method)(server.base_url + f"/v1/responses/{response_id}", timeout=10)
    assert r.status_code == 404
    assert_envelope(r)


def test_server_unharmed_after_the_corpus(server, baseline):
    body, before = baseline
    after = requests.post(server.base_url + "/v1/responses", json=body, timeout=120).json()
    assert after["output_text"] == before
    assert requests.get(server.base_url + "/health", timeout=5).json()["status"] == "ok"
