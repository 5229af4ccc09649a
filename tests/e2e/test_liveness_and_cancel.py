"""The worker stays responsive while generating, and a departed client stops generation."""

from __future__ import annotations

import threading
import time

import requests

from .streams import LONG, open_stream, read_events


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
