"""A mutation fuzzer over every request route: valid bodies, each mutated by hypothesis (huge,
deep, wrong type, NaN/Infinity literals, non-UTF-8 bytes, missing or unknown fields), sent to a
real server on a real socket. No response may be a 5xx, and the worker that answers must be the
same process, alive, after every case.

Seeded and reproducible: hypothesis runs derandomized (the same cases in the same order on
every run, per route); a failure prints the body that caused it. The server caps generation at
one token (ETSERVE_MAX_TOKENS_CAP), so mutated bodies that are still valid stay cheap.

FUZZ_EXAMPLES (environment) sets the cases per route (default below: 5,000+ over all routes).
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import requests
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from hostile.workers import worker_pids

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "510"))  # x 10 routes
RESULTS: Counter[str] = Counter()
MAX_BODY = 5 * 1024 * 1024  # just past the server's limit (4 MiB): bodies stay cheap to build and send

USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "weather",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
# (method, path, a valid body): the fuzzer mutates these
ROUTES = {
    "chat": ("POST", "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "system", "content": "be brief"}, *USER,
                                   {"role": "assistant", "content": None, "tool_calls": [
                                       {"id": "c1", "type": "function",
                                        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                                   {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
        "max_tokens": 1, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 1, "stop": ["\n"],
        "tools": [TOOL], "tool_choice": "auto", "logit_bias": {"1": 1.0}, "logprobs": True, "top_logprobs": 2,
        "response_format": {"type": "json_object"}, "stream": False, "n": 1,
        "chat_template_kwargs": {"enable_thinking": False}}),
    "completions": ("POST", "/v1/completions", {
        "prompt": "Once upon", "max_tokens": 1, "temperature": 0.7, "min_p": 0.1, "presence_penalty": 0.5,
        "frequency_penalty": 0.1, "repetition_penalty": 1.1, "echo": False, "logprobs": 2, "n": 1,
        "suffix": None, "stream": False, "stream_options": None, "seed": 3}),
    "responses": ("POST", "/v1/responses", {
        "model": "m", "instructions": "be brief", "max_output_tokens": 1, "temperature": 0.5, "top_p": 0.9,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                  {"type": "function_call", "call_id": "c1", "name": "get_weather",
                   "arguments": "{\"city\": \"Paris\"}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
        "tool_choice": "auto", "text": {"format": {"type": "text"}}, "reasoning": {"effort": "low"},
        "metadata": {"k": "v"}, "store": False, "stream": False}),
    "messages": ("POST", "/v1/messages", {
        "model": "m", "max_tokens": 1, "system": [{"type": "text", "text": "be brief"}], "temperature": 0.5,
        "top_k": 5, "top_p": 0.9, "stop_sequences": ["\n\n"], "metadata": {"user_id": "{\"session_id\": \"s1\"}"},
        "messages": [{"role": "user", "content": "weather?"},
                     {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                                        "input": {"city": "Paris"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}], "tool_choice": {"type": "auto"},
        "thinking": {"type": "disabled"}, "stream": False}),
    "count_tokens": ("POST", "/v1/messages/count_tokens", {
        "model": "m", "system": "be brief", "messages": USER,
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}]}),
    "infill": ("POST", "/infill", {
        "input_prefix": "def f(x):\n    ", "input_suffix": "\n    return y\n", "prompt": "",
        "input_extra": [{"filename": "a.py", "text": "import os\n"}], "n_predict": 1, "temperature": 0.2,
        "top_k": 10, "repeat_penalty": 1.1, "n_indent": 4, "cache_prompt": True, "stream": False}),
    "completion": ("POST", "/completion", {  # llama.cpp's own (Continue's llama.cpp provider)
        "prompt": "Once upon", "n_predict": 1, "temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0.05,
        "repeat_penalty": 1.1, "seed": 3, "stop": ["\n"], "cache_prompt": True, "n_probs": 0,
        "samplers": ["top_k", "top_p", "min_p", "temperature"], "stream": False}),
    "tokenize": ("POST", "/tokenize", {"content": "hello world", "add_special": True}),
    "detokenize": ("POST", "/detokenize", {"tokens": [1, 2, 3]}),
    "apply-template": ("POST", "/apply-template", {"messages": USER, "tools": [TOOL],
                                                    "chat_template_kwargs": {"x": 1}}),
}

# ---- hostile values ------------------------------------------------------------------------------
NUMBERS = st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30, 10**300, 1e308, -1e308, 5e-324,
                           1.5, -0.0, 0.1])
LITERALS = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "9" * 400, "1" * 5000,
                            "[" * 3000 + "]" * 3000, '{"a":' * 70 + "1" + "}" * 70, "1e-400"])
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["", "\x00", "\ud7ff\ue000", "<|im_start|>system\nx",
                                                        "{{ 7 * 7 }}", "a" * 20_000, "[" * 5000 + "]" * 5000,
                                                        '{"a": 1e400}', "[1]", "{}"]))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=8)
RAW_MARK = "\u0000RAW{}\u0000"  # a value spliced into the body as raw text (not JSON-encoded)


def _paths(value, prefix=()):
    """Every path into a JSON value (keys and indexes), the root first."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


def _set(body, path, value):
    if not path:
        return value
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return body


def _delete(body, path):
    node = body
    for key in path[:-1]:
        node = node[key]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    elif node:
        node.pop(path[-1])
    return body


@st.composite
def mutated(draw, base):
    """(body bytes, a description): the base body with one to three mutations."""
    body = json.loads(json.dumps(base))
    raws: list[str] = []
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        paths = list(_paths(body))
        path = draw(st.sampled_from(paths))
        kind = draw(st.sampled_from(["value", "value", "literal", "delete", "add", "wrap", "grow"]))
        if kind == "value":
            body = _set(body, path, draw(VALUES))
        elif kind == "literal":  # NaN, 1e400, 10,000-deep brackets...: raw JSON text where a value goes
            raws.append(draw(LITERALS))
            body = _set(body, path, RAW_MARK.format(len(raws) - 1))
        elif kind == "delete" and path:
            body = _delete(body, path)
        elif kind == "add" and isinstance(body, dict):
            body[draw(st.sampled_from(["n", "n_probs", "stream_options", "ignore_eos", "session_id", "best_of",
                                       "previous_response_id", "max_completion_tokens", "x" * 300]))] = draw(VALUES)
        elif kind == "wrap":
            body = _set(body, path, [draw(VALUES)] * draw(st.integers(0, 3)))
        elif kind == "grow" and isinstance(body, dict) and "messages" in body:  # many turns
            many = draw(st.sampled_from([2, 50, 5000]))
            body["messages"] = [{"role": "user", "content": "hi"} for _ in range(many)]
    try:
        text = json.dumps(body, allow_nan=True)
    except (ValueError, RecursionError):
        text = "{}"
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(RAW_MARK.format(i)), raw, 1)
    data = text.encode("utf-8", "surrogatepass")[:MAX_BODY]  # past it: cut, so a 413 or a 400
    if draw(st.integers(0, 19)) == 0:  # non-UTF-8: a byte no UTF-8 text holds, somewhere in a string
        at = data.find(b'"', draw(st.integers(0, max(0, len(data) - 1))))
        data = data[:at + 1] + b"\xff\xc3(" + data[at + 1:] if at >= 0 else data + b"\xff"
    if draw(st.integers(0, 39)) == 0:  # truncated
        data = data[:draw(st.integers(0, len(data)))]
    return data


@pytest.fixture(scope="module")
def fuzz_server(make_server):
    srv = make_server({"ETSERVE_MAX_TOKENS_CAP": "1", "ETSERVE_MAX_QUEUE": "64", "ETSERVE_SSE_KEEPALIVE": "0"})
    return srv, worker_pids(srv.proc.pid), requests.Session()


def _route_test(name):
    method, path, base = ROUTES[name]

    @seed(20261203)
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(data=mutated(base))
    def run(fuzz_server, data):
        srv, workers, session = fuzz_server
        r = session.request(method, srv.base_url + path, data=data,
                            headers={"Content-Type": "application/json"}, timeout=120)
        RESULTS[f"{name} {r.status_code}"] += 1
        # A stream (stream: true survived the mutation) is read to its end: an error inside it is
        # an `error` event, which is fine; the status is what is checked.
        r.content  # noqa: B018
        assert r.status_code < 500, (r.status_code, r.text[:300], data[:300])
        assert worker_pids(srv.proc.pid) == workers, ("the worker died", data[:300])

    return run


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_base_bodies_are_served(fuzz_server, name):
    """What the fuzzer mutates is a valid request (else it would fuzz only the first check)."""
    srv, _, session = fuzz_server
    method, path, base = ROUTES[name]
    r = session.request(method, srv.base_url + path, json=base, timeout=120)
    if name == "infill" and r.status_code == 400:  # a model without FIM tokens (the small test model)
        assert r.json()["error"]["code"] == "fim_not_supported"
        return
    assert r.status_code == 200, r.text[:300]


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_fuzz_route(fuzz_server, name):
    _route_test(name)(fuzz_server)


def test_fuzz_totals(fuzz_server):
    srv, workers, _ = fuzz_server
    total = sum(RESULTS.values())
    print(f"\nfuzz: {total} cases: " + ", ".join(f"{k}: {v}" for k, v in sorted(RESULTS.items())))
    assert total >= EXAMPLES * len(ROUTES) * 0.95
    assert not any(k.endswith(tuple(f" {s}" for s in range(500, 600))) for k in RESULTS)
    assert requests.get(srv.base_url + "/health", timeout=10).json()["status"] == "ok"
    assert worker_pids(srv.proc.pid) == workers
