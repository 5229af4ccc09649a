"""50 clients hang up mid-stream or mid-prefill; each stops the engine within a step, and a bystander's
request running alongside is never cancelled."""

from __future__ import annotations

import threading
import time

import requests

from .streams import LONG, open_stream, read_events

LONG_PROMPT = {"messages": [{"role": "user", "content": "Summarise this text. " + "The quick brown fox. " * 60}],
               "temperature": 0, "max_tokens": 200, "stream": True}


def test_disconnect_storm(server):
    health_codes = []
    stop = threading.Event()

    def watch_health():
        while not stop.is_set():
            health_codes.append(requests.get(server.base_url + "/health", timeout=5).status_code)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch_health)
    watcher.start()
    try:
        for i in range(50):
            server.wait_idle()
            start = server.health()["engine"]["forward_calls"]
            if i % 2 == 0:  # mid-stream
                sock = open_stream(server, {**LONG, "stream": True})
                read_events(sock, 1 + i % 3)
            else:  # mid-prefill (a long prompt, prefilled in chunks): hang up right away
                sock = open_stream(server, LONG_PROMPT)
            sock.close()
            at_close = server.health()["engine"]["forward_calls"]
            after = server.wait_idle()["engine"]["forward_calls"]
            assert after - at_close <= 1, f"client {i}: {after - at_close} steps after hanging up"
            assert after - start < LONG["max_tokens"]
    finally:
        stop.set()
        watcher.join()
    assert health_codes and set(health_codes) == {200}


def test_a_bystander_is_not_cancelled_by_others_leaving(server):
    server.wait_idle()
    result = {}

    def bystander():
        body = {"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 12, "temperature": 0}
        result["r"] = requests.post(server.base_url + "/v1/chat/completions", json=body, timeout=300).json()

    t = threading.Thread(target=bystander)
    leavers = [open_stream(server, {**LONG, "stream": True}) for _ in range(5)]
    t.start()
    for sock in leavers:
        sock.close()
    t.join(timeout=300)
    choice = result["r"]["choices"][0]
    assert choice["finish_reason"] in ("stop", "length") and result["r"]["usage"]["completion_tokens"] >= 1
