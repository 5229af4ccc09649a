"""A corpus of malformed and hostile requests: each gets a 4xx envelope quickly; the server is unharmed."""

from __future__ import annotations

import json

import pytest
import requests

OK_MSG = [{"role": "user", "content": "hi"}]
FIELDS = {
    "temperature": [-0.1, 2.5, "hot", True, [1], {"a": 1}, 1e400],
    "top_p": [-1, 1.5, "x", False],  # 0 is valid: the best token only
    "top_k": [-1, 1.5, "10", [3]],
    "min_p": [-0.5, 2, "0.1"],
    "max_tokens": [0, -2, 1.5, "16", True],  # (-1: llama.cpp's "no limit", and 10 ** 30: cut to the context, accepted)
    "max_completion_tokens": [0, -7, "x"],
    "presence_penalty": [-3, 3, "x"],
    "frequency_penalty": [-2.5, 9, {}],
    "repetition_penalty": [0, -1, 100, "1"],
    "seed": ["seed", 1.5, 2 ** 70, -(2 ** 70)],
    "stop": [5, [1, 2], ["x"] * 17, ["y" * 600], {"a": "b"}],
    "stream": ["yes", 1, [True]],
    "stream_options": ["on", [1]],
    "n": [0, -1, 9, 100, "1"],
    "logit_bias": ["x", [1], {"abc": 1}, {"1": 200}, {"1": "x"}, {"99999999": 1}, {str(i): 1 for i in range(2000)}],
    "logprobs": ["yes", 1],
    "top_logprobs": [-1, 21, "3"],
    "tools": ["x", [1], [{"type": "function"}], [{"type": "other", "function": {"name": "f"}}]],
    "tool_choice": ["required", {"type": "function", "function": {"name": "f"}}, 3, "sometimes"],
    "response_format": [{"type": "xml"}, "json", {"type": "json_schema"}, {"type": "json_schema", "json_schema": []},
                        {"type": "json_schema", "json_schema": {"schema": {"type": "object", "if": {}}}},
                        # llguidance's options that are no object (a 500 once)
                        {"type": "json_schema", "json_schema": {"schema": {"type": "object", "x-guidance": "abc"}}},
                        {"type": "json_schema", "json_schema": {"schema": {"type": "object", "x-guidance": [1]}}}],
    "model": [5, ["a"], {"name": "x"}],  # any string is served (single-model server)
    "chat_template_kwargs": ["x", [1]],
    # llama.cpp's fields (its web UI sends them to chat)
    "reasoning_format": [["none"], {"a": 1}, 5, "bogus"],
    "samplers": [{"a": 1}, "zz", [5], ["nope"]],
    "cache_prompt": ["no", 1.5],
    "ignore_eos": ["yes", [True]],
    "typ_p": [0.5, [1]],
    "repeat_penalty": ["x", -1],
    "unknown_field": [1],
}
BAD_MESSAGES = [
    None, "hi", 5, [], {}, [None], ["hi"], [{"content": "no role"}], [{"role": "wizard", "content": "x"}],
    [{"role": "user"}], [{"role": "user", "content": 5}], [{"role": "user", "content": [{"type": "hologram"}]}],
    [{"role": "user", "content": [{"type": "text"}]}], [{"role": "user", "content": [5]}],
    [{"role": "user", "content": "x"}] * 5000, [{"role": ["user"], "content": "x"}],
    [{"role": "tool", "content": None}], [{"role": "user", "content": "x", "tool_calls": "nope"}],
    [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}],
    [{"role": "user", "content": "word " * 3000}],
]


# Every field also refuses these shapes.
ANY_FIELD_JUNK = [{"deep": {"er": [1, 2, {"x": None}]}}, "\u0000", "9" * 400]


def cases():
    for field, values in FIELDS.items():
        junk = ANY_FIELD_JUNK if field not in ("model", "chat_template_kwargs", "stop", "tool_choice") else []
        for i, value in enumerate(values + junk):
            yield f"{field}-{i}", "json", {"messages": OK_MSG, field: value}
    for i, messages in enumerate(BAD_MESSAGES):
        yield f"messages-{i}", "json", {"messages": messages}
    raw = [b"", b"{", b"}", b"[]", b"null", b"1", b'"str"', b"{\"messages\": [}", b"\xff\xfe\x00",
           b'{"messages": NaN}', b'{"messages": [], "temperature": Infinity}', b'{"temperature": -Infinity}',
           b"{" * 10000 + b"}" * 10000, b"[" * 500 + b"]" * 500, b'{"messages": "\xc3\x28"}',
           b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 0}',
           b'{"messages": [{"role": "user", "content": "a\\udfffb"}], "max_tokens": 4}', b"\x00" * 100,
           b'{"a":' * 200 + b"1" + b"}" * 200, b"<xml/>", b"messages=hi"]
    for i, body in enumerate(raw):
        yield f"raw-{i}", "raw", body
    for i, n in enumerate([10_000]):
        yield f"many-messages-{i}", "json", {"messages": [{"role": "user", "content": "x"}] * n}
    for route in ("/v1/completions", "/tokenize", "/detokenize", "/apply-template"):
        for i, body in enumerate([{}, {"prompt": 5}, {"tokens": ["a"]}, {"tokens": [-1]}, {"content": 3},
                                  {"messages": "x"}, {"prompt": [[1, "a"]]}, {"prompt": "x", "suffix": "y"}]):
            yield f"{route}-{i}", ("route", route), body


CASES = list(cases())


@pytest.fixture(scope="module")
def baseline(server):
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}
    text = requests.post(server.base_url + "/v1/chat/completions", json=body, timeout=120).json()
    return body, text["choices"][0]["message"]["content"]


@pytest.mark.parametrize("name, kind, body", CASES, ids=[c[0] for c in CASES])
def test_hostile_request_gets_a_4xx_envelope(server, baseline, name, kind, body):
    path = "/v1/chat/completions"
    if kind == "raw":
        r = requests.post(server.base_url + path, data=body, headers={"Content-Type": "application/json"}, timeout=10)
    else:
        if isinstance(kind, tuple):
            path = kind[1]
        data = json.dumps(body, allow_nan=True).encode()
        r = requests.post(server.base_url + path, data=data, headers={"Content-Type": "application/json"},
                          timeout=10)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert "Traceback" not in r.text and "/work/" not in r.text and ".py" not in r.text


def test_server_unharmed_after_the_corpus(server, baseline):
    body, before = baseline
    after = requests.post(server.base_url + "/v1/chat/completions", json=body, timeout=120).json()
    assert after["choices"][0]["message"]["content"] == before
    assert requests.get(server.base_url + "/health", timeout=5).json()["status"] == "ok"


def test_template_injection_is_rendered_as_text(server):
    sneaky = "{{ ''.__class__.__mro__ }}{% for x in range(10) %}X{% endfor %}"
    r = requests.post(server.base_url + "/apply-template", timeout=10,
                      json={"messages": [{"role": "user", "content": sneaky}]})
    assert r.status_code == 200 and sneaky in r.json()["prompt"]


@pytest.mark.parametrize("path, extra", [
    ("/v1/chat/completions", {"messages": OK_MSG}),
    ("/v1/completions", {"prompt": "hi"}),
])
@pytest.mark.parametrize("top_p", [1e-300, 0])
def test_extreme_but_valid_sampling_values_are_served(server, path, extra, top_p):
    """A top_k past the vocabulary and past int32 (the C sampler's field) keeps every token; a
    top_p of 1e-300 (schemathesis found the 500) or 0 (OpenAI allows it; some clients send it for
    greedy) keeps the best one: greedy text, a 200."""
    body = {"max_tokens": 4, "top_k": 2**62, "top_p": top_p, "seed": 1, **extra}
    r = requests.post(server.base_url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text[:300]
    greedy = requests.post(server.base_url + path, json={**body, "top_k": 0, "temperature": 0}, timeout=120)
    field = "message" if path.endswith("chat/completions") else "text"
    assert r.json()["choices"][0][field] == greedy.json()["choices"][0][field]


BROKEN_CHUNKED = {
    "chunk size not hex": b"zz\r\n{}\r\n0\r\n\r\n",
    "negative chunk size": b"-2\r\n{}\r\n0\r\n\r\n",
    "no chunk terminator": b"2\r\n{}XX0\r\n\r\n",
    "bad trailer": b"2\r\n{}\r\n0\r\nno colon here\r\n\r\n",
}


def _raw_post(server, path: str, body: bytes) -> tuple[int, dict]:
    import socket

    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():  # the response's own framing
        out, rest = b"", payload
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size, 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        payload = out
    return status, json.loads(payload)


@pytest.mark.parametrize("name", sorted(BROKEN_CHUNKED))
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/completion"])
def test_a_chunked_body_the_server_cannot_frame_is_a_400(server, name, path):
    """Found by fuzzing: gunicorn's chunk parser raised out of the body read, a 500 with a traceback."""
    status, body = _raw_post(server, path, BROKEN_CHUNKED[name])
    assert status == 400, body
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    else:
        assert body["error"]["code"] == "invalid_body", body
    assert "could not be read" in json.dumps(body)


@pytest.mark.parametrize("stream", [False, True])
def test_a_deadline_past_int64_is_refused_and_the_largest_is_served(server, stream):
    """/completion's t_max_predict_ms of 10**400 was a 500 (an OverflowError turning it into
    seconds); llama.cpp reads it as an int64."""
    raw = '{"prompt": "hi", "n_predict": 2, "stream": %s, "t_max_predict_ms": 1%s}' % (
        "true" if stream else "false", "0" * 400)
    r = requests.post(server.base_url + "/completion", data=raw, headers={"Content-Type": "application/json"},
                      timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "t_max_predict_ms", r.text
    r = requests.post(server.base_url + "/completion", timeout=60,
                      json={"prompt": "hi", "n_predict": 2, "t_max_predict_ms": 2 ** 63 - 1})
    assert r.status_code == 200 and r.json()["tokens_predicted"] >= 1, r.text


UNPARSABLE = {
    "request line too long": (b"GET /v1/responses/" + b"a" * 8000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    "header too large": (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n", 431),
    "too many headers": (b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(120))
                         + b"\r\n", 431),
    "control character in a header": (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Request-Id: a\x7fb\r\n\r\n", 400),
    "bad method token": (b"G(ET /health HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "negative content length": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400),
    "http/2 preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),
}


@pytest.mark.parametrize("name", sorted(UNPARSABLE))
def test_what_gunicorn_refuses_itself_comes_back_as_json(server, name):
    """Found by fuzzing: gunicorn answered these with its HTML page; both SDKs read the JSON error
    shape (the body carries OpenAI's and Anthropic's fields: the route is not known yet)."""
    import socket

    request, status = UNPARSABLE[name]
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    assert int(head.split(b" ", 2)[1]) == status, head
    assert b"content-type: application/json" in head.lower(), head
    body = json.loads(payload)
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert body["error"]["message"] and "code" in body["error"] and "param" in body["error"]
    assert requests.get(server.base_url + "/health", timeout=5).status_code == 200
