"""SSE keep-alive: a stream that waits (for the model, or for its long prompt to be read) gets
`: keep-alive` comment lines, which clients skip; the text that follows is unchanged."""

from __future__ import annotations

import json
import socket
import threading
import time

import openai
import pytest
import requests

from .streams import LONG, open_stream, read_events

INTERVAL = 0.3
PROMPT = "The old lighthouse keeper climbed the stairs and"


@pytest.fixture(scope="module")
def ka_server(make_server):
    # small prefill chunks: a long prompt takes many forward calls, with cancellation checks between them
    # one slot: a request waits behind the Occupier
    return make_server({"ETSERVE_SSE_KEEPALIVE": str(INTERVAL), "ETSERVE_PREFILL_CHUNK": "16", "ETSERVE_PARALLEL": "1"})


def wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def stream_lines(srv, path: str, body: dict) -> list[tuple[float, str]]:
    """Every line of the SSE body (blank separators dropped), with its arrival time."""
    out = []
    with requests.post(srv.base_url + path, json={**body, "stream": True}, stream=True, timeout=300) as r:
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines(chunk_size=None, decode_unicode=False):
            if line:
                out.append((time.monotonic(), line.decode("utf-8")))
    return out


def completion_text(lines: list[tuple[float, str]]) -> str:
    data = [line[len("data: "):] for _, line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return "".join(c["text"] for d in data[:-1] for c in json.loads(d)["choices"])


class Occupier:
    """A long streamed generation holding the engine, closed on exit."""

    def __init__(self, srv):
        self.srv = srv

    def __enter__(self):
        self.sock = open_stream(self.srv, {**LONG, "stream": True, "max_tokens": 400})
        read_events(self.sock, 1)
        return self

    def release_after(self, seconds: float) -> None:
        threading.Timer(seconds, self.sock.close).start()

    def __exit__(self, *exc):
        self.sock.close()
        self.srv.wait_idle()


def test_queued_stream_gets_keepalives_before_its_first_data(ka_server):
    srv = ka_server
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    with Occupier(srv) as occ:
        occ.release_after(2.5)  # the queued stream waits ~2.5 s, ~8 intervals
        t0 = time.monotonic()
        lines = stream_lines(srv, "/v1/completions", body)
    first_data = next(i for i, (_, line) in enumerate(lines) if line.startswith("data: "))
    keepalives = [t for t, line in lines[:first_data] if line == ": keep-alive"]
    assert all(line == ": keep-alive" or line.startswith("data: ") for _, line in lines), lines
    waited = lines[first_data][0] - t0
    assert len(keepalives) >= 3, f"{len(keepalives)} keep-alives in a {waited:.1f} s wait"
    assert len(keepalives) <= waited / INTERVAL + 1, "keep-alives come more often than the interval"
    expected = requests.post(srv.base_url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]
    assert expected and completion_text(lines) == expected


def test_long_prefill_gets_keepalives_before_the_first_token(ka_server):
    srv = ka_server
    srv.wait_idle()
    # ~450 fresh tokens in chunks of 16: ~28 forward calls before the first token
    words = " ".join(f"w{i}" for i in range(130))
    body = {"prompt": f"{time.time_ns()} {words}", "max_tokens": 2, "temperature": 0}
    tokens = requests.post(srv.base_url + "/tokenize", json={"content": body["prompt"]}, timeout=30).json()["tokens"]
    assert 350 < len(tokens) < 500
    before = srv.health()["engine"]["forward_calls"]
    lines = stream_lines(srv, "/v1/completions", body)
    prefill_calls = srv.health()["engine"]["forward_calls"] - before - 1
    assert prefill_calls >= len(tokens) // 16
    first_data = next(i for i, (_, line) in enumerate(lines) if line.startswith("data: "))
    assert any(line == ": keep-alive" for _, line in lines[:first_data]), "no keep-alive during the prefill"


def test_openai_sdk_streams_through_keepalives(ka_server):
    srv = ka_server
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Name a color."}]
    expected = client.chat.completions.create(model=model, messages=messages, max_tokens=10,
                                              temperature=0).choices[0].message.content
    with Occupier(srv) as occ:
        occ.release_after(2.0)
        t0 = time.monotonic()
        stream = client.chat.completions.create(model=model, messages=messages,
                                                max_tokens=10, temperature=0, stream=True)
        parts, first_content = [], None
        for chunk in stream:
            for c in chunk.choices:
                if c.delta.content:
                    first_content = first_content or time.monotonic()
                    parts.append(c.delta.content)
    # the SDK saw several keep-alive intervals pass before the first token, and skipped the comments
    assert first_content is not None and first_content - t0 > 3 * INTERVAL
    assert "".join(parts) == expected


def test_a_queued_stream_whose_client_left_never_runs(ka_server):
    srv = ka_server
    with Occupier(srv):
        started = srv.health()["engine"]["requests"]
        payload = json.dumps({"prompt": PROMPT, "max_tokens": 30, "stream": True}).encode()
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        received = b""
        while b": keep-alive" not in received:
            chunk = sock.recv(4096)
            assert chunk, "stream ended early"
            received += chunk
        sock.close()  # gone while queued, after keep-alives went out
        wait_for(lambda: srv.health()["engine"]["waiting"] == 0)
    assert srv.health()["engine"]["requests"] == started, "a departed waiter was run"
