"""The worker stays responsive while generating, and a departed client stops generation."""

from __future__ import annotations

import json
import socket
import threading
import time

import requests

LONG = {"messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "temperature": 0, "max_tokens": 200}


def open_stream(server, body: dict) -> socket.socket:
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    return sock


def read_events(sock: socket.socket, n: int) -> bytes:
    """Read until `n` content events have arrived."""
    data = b""
    while data.count(b'"content"') < n + 1:  # +1: the role chunk carries "content": ""
        chunk = sock.recv(65536)
        assert chunk, "stream ended early"
        data += chunk
    return data


def test_health_answers_fast_while_streaming(server):
    done = threading.Event()

    def stream():
        with requests.post(server.base_url + "/v1/chat/completions", json={**LONG, "stream": True, "max_tokens": 60},
                           stream=True, timeout=300) as r:
            for _ in r.iter_lines():
                pass
        done.set()

    t = threading.Thread(target=stream)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while not server.health()["engine"]["generating"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        latencies = []
        while not done.is_set() and len(latencies) < 40:
            t0 = time.perf_counter()
            r = requests.get(server.base_url + "/health", timeout=5)
            latencies.append(time.perf_counter() - t0)
            assert r.status_code == 200
            time.sleep(0.05)
        assert len(latencies) >= 5, "generation ended before health could be sampled"
        assert max(latencies) < 0.1, f"/health took {max(latencies) * 1000:.0f} ms while generating"
    finally:
        t.join()


def test_closing_the_stream_stops_decoding(server):
    server.wait_idle()
    start = server.health()["engine"]["forward_calls"]
    sock = open_stream(server, {**LONG, "stream": True})
    read_events(sock, 3)
    sock.close()
    at_close = server.health()["engine"]["forward_calls"]
    after = server.wait_idle()["engine"]["forward_calls"]
    assert after - at_close <= 1, f"decoded {after - at_close} steps after the client left"
    assert after - start < LONG["max_tokens"]


def test_abandoned_non_streaming_request_stops_decoding(server):
    server.wait_idle()
    start = server.health()["engine"]["forward_calls"]
    sock = open_stream(server, LONG)
    deadline = time.monotonic() + 60
    while server.health()["engine"]["forward_calls"] - start < 4:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    sock.close()
    at_close = server.health()["engine"]["forward_calls"]
    after = server.wait_idle()["engine"]["forward_calls"]
    assert after - at_close <= 1
    assert after - start < LONG["max_tokens"]
    r = requests.post(server.base_url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
