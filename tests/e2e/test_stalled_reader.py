"""A client that stops reading a stream (keep-alives off) loses its connection after
--write-timeout seconds without progress, and its generation stops: the engine serves others.

A real socket with a tiny receive buffer sends a streaming request whose answer is far larger
than the buffers between the two (logprobs with 20 alternatives per token) and never reads."""

from __future__ import annotations

import json
import socket
import time

import pytest
import requests

WRITE_TIMEOUT = 2


def _stalled_stream(server) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect(("127.0.0.1", server.port))
    body = json.dumps({"messages": [{"role": "user", "content": "Write a very long story."}], "stream": True,
                       "max_tokens": 450, "logprobs": True, "top_logprobs": 20, "n": 4, "temperature": 1.0,
                       "seed": 1}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    sock.sendall(head + body)
    return sock  # and never read


def _engine_frees(server, within: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < within:
        if not server.health()["engine"]["generating"]:
            return time.monotonic() - start
        time.sleep(0.2)
    raise AssertionError(f"the engine is still generating for the stalled reader after {within} s")


@pytest.fixture(scope="module")
def timed_server(make_server):
    return make_server({"ETSERVE_WRITE_TIMEOUT": str(WRITE_TIMEOUT), "ETSERVE_SSE_KEEPALIVE": "1"})


def test_a_stalled_reader_frees_the_engine(timed_server):
    sock = _stalled_stream(timed_server)
    try:
        deadline = time.monotonic() + 30
        while not timed_server.health()["engine"]["generating"] and time.monotonic() < deadline:
            time.sleep(0.05)
        # 4 x 450 tokens with their logprobs would take minutes here; the stalled write ends it
        _engine_frees(timed_server, within=40)
        r = requests.post(timed_server.base_url + "/v1/chat/completions", timeout=60,
                          json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200, r.text
        # the server dropped the stalled connection: what the client finally reads ends early
        sock.settimeout(10)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except (ConnectionResetError, socket.timeout):
            pass
        assert b"data: [DONE]" not in data
    finally:
        sock.close()
