"""Admission: a bounded queue in front of the engine; overflow is a clean 429, departed waiters never run."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from .streams import LONG, open_stream, read_events


@pytest.fixture(scope="module")
def small_queue_server(make_server):
    return make_server({"ETSERVE_MAX_QUEUE": "1", "ETSERVE_PARALLEL": "1"})  # one slot: the next waits


def wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_queue_overflow_is_429_and_waiters_run_in_turn(small_queue_server):
    srv = small_queue_server
    url = srv.base_url + "/v1/chat/completions"
    running = open_stream(srv, {**LONG, "stream": True})
    read_events(running, 1)
    results = {}

    def waiter():
        results["b"] = requests.post(url, timeout=300, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0})

    t = threading.Thread(target=waiter)
    t.start()
    wait_for(lambda: srv.health()["engine"]["waiting"] == 1)
    r = requests.post(url, timeout=30, json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert r.status_code == 429
    assert int(r.headers["Retry-After"]) > 0
    assert r.json()["error"]["code"] == "queue_full"
    running.close()  # frees the engine: the waiter runs next
    t.join(timeout=120)
    assert results["b"].status_code == 200 and results["b"].json()["choices"][0]["message"]["content"]


def test_a_waiter_whose_client_left_never_runs(small_queue_server):
    srv = small_queue_server
    srv.wait_idle()
    running = open_stream(srv, {**LONG, "stream": True})
    read_events(running, 1)
    started = srv.health()["engine"]["requests"]
    queued = open_stream(srv, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 50})
    wait_for(lambda: srv.health()["engine"]["waiting"] == 1)
    queued.close()
    wait_for(lambda: srv.health()["engine"]["waiting"] == 0)
    running.close()
    srv.wait_idle()
    time.sleep(0.5)
    assert srv.health()["engine"]["requests"] == started  # the departed waiter never started
