"""Process faults: graceful SIGTERM, and a worker killed outright comes back by itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import requests

from .streams import LONG, open_stream, read_events


def worker_pids(master_pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(master_pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_sigterm_lets_the_running_stream_finish(make_server):
    srv = make_server({})
    result = {}

    def stream():
        body = {**LONG, "max_tokens": 12, "stream": True}
        with requests.post(srv.base_url + "/v1/chat/completions", json=body, stream=True, timeout=300) as r:
            result["lines"] = [line for line in r.iter_lines() if line and not line.startswith(b":")]  # ":" lines: SSE comments

    t = threading.Thread(target=stream)
    t.start()
    deadline = time.monotonic() + 60
    while not srv.health()["engine"]["generating"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    srv.proc.send_signal(signal.SIGTERM)
    t.join(timeout=120)
    lines = result["lines"]
    assert lines[-1] == b"data: [DONE]"
    finish = [c["finish_reason"] for line in lines[:-1] for c in json.loads(line[6:])["choices"]]
    assert finish[-1] == "length"  # it ran to its max_tokens, not cut off
    assert srv.proc.wait(timeout=60) == 0


def test_a_killed_worker_is_replaced_and_serves_again(make_server):
    srv = make_server({})
    sock = open_stream(srv, {**LONG, "stream": True})
    read_events(sock, 2)
    (worker,) = worker_pids(srv.proc.pid)
    os.kill(worker, signal.SIGKILL)
    sock.settimeout(30)
    tail = b""
    try:
        while chunk := sock.recv(65536):  # the stream ends (closed), it does not hang
            tail += chunk
    except ConnectionResetError:
        pass
    sock.close()
    deadline = time.monotonic() + 120
    while True:
        try:
            if requests.get(srv.base_url + "/health", timeout=2).json().get("status") == "ok":
                break
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, "no healthy worker after kill -9"
        time.sleep(0.2)
    assert worker_pids(srv.proc.pid) != [worker]
    r = requests.post(srv.base_url + "/v1/chat/completions", timeout=120,
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]


def test_sigterm_with_requests_queued_and_new_connections_arriving(make_server):
    """Requests in flight in both slots and queued before the signal run to the end, new
    connections are refused or served, nothing hangs, and the server exits cleanly."""
    srv = make_server({"ETSERVE_PARALLEL": "2"})
    url = srv.base_url + "/v1/chat/completions"
    results: dict[str, object] = {}

    def call(name: str, body: dict) -> None:
        try:
            r = requests.post(url, json=body, timeout=120, stream=body.get("stream", False))
            if body.get("stream"):
                lines = [line for line in r.iter_lines() if line and not line.startswith(b":")]
                results[name] = (r.status_code, lines)
            else:
                results[name] = (r.status_code, r.json())
        except requests.exceptions.ChunkedEncodingError as e:  # cut off mid-body
            results[name] = ("broken", str(e))
        except requests.ConnectionError as e:  # refused or reset: a clean error, not a hang
            results[name] = ("connection", str(e))

    running = threading.Thread(target=call, args=("running", {**LONG, "max_tokens": 24, "stream": True}))
    running.start()
    deadline = time.monotonic() + 60
    while not srv.health()["engine"]["generating"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    queued = []
    for i in range(3):
        body = {"messages": [{"role": "user", "content": f"Say hello to number {i}."}], "max_tokens": 6,
                "temperature": 0}
        queued.append(threading.Thread(target=call, args=(f"queued{i}", body)))
        queued[-1].start()
    while srv.health()["engine"]["slots"]["busy"] < 2 or srv.health()["engine"]["waiting"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    srv.proc.send_signal(signal.SIGTERM)
    late = []
    for i in range(4):  # new connections while the worker drains
        time.sleep(0.1)
        late.append(threading.Thread(target=call, args=(f"late{i}", {
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0})))
        late[-1].start()
    for t in [running, *queued, *late]:
        t.join(timeout=150)
        assert not t.is_alive(), "a request hung through the shutdown"
    status, lines = results["running"]
    assert status == 200 and lines[-1] == b"data: [DONE]"
    for i in range(3):  # admitted before the signal: they all ran to the end
        status, body = results[f"queued{i}"]
        assert status == 200, body
        assert body["choices"][0]["finish_reason"] in ("stop", "length") and body["choices"][0]["message"]["content"]
    for i in range(4):
        status, body = results[f"late{i}"]
        # refused at the socket, or served in full, or a clean JSON error: never a hang or a broken body
        assert status == "connection" or status == 200 or (isinstance(body, dict) and "error" in body), body
    assert srv.proc.wait(timeout=60) == 0
