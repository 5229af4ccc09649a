"""Soak: 330 mixed requests against one server (chat and completions, streamed and not, some
cancelled mid-stream, a few clients at once so some wait in the queue and get keep-alives);
the worker's memory and open descriptors stay flat after a warm-up."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
import requests

WARMUP = 30
MEASURED = 300
CLIENTS = 3
MAX_RSS_GROWTH_MIB = 48  # a per-request leak of one logits row (~190 KiB) or one KV snapshot would exceed it
MAX_FD_GROWTH = 8


@pytest.fixture(scope="module")
def soak_server(make_server):
    return make_server({"ETSERVE_SSE_KEEPALIVE": "0.2"})


def worker_pid(master_pid: int) -> int:
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    assert len(children) == 1, f"expected one gunicorn worker, found {children}"
    return int(children[0])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def body_for(i: int) -> tuple[str, dict]:
    """Request i of the mix: its route and body (every fifth is cancelled, see run_one)."""
    kind = i % 5
    words = f"Request {i}: name a {['colour', 'fruit', 'city', 'tool', 'animal'][i % 5]}."
    common = {"max_tokens": 3, "temperature": 0.7, "seed": i}
    if kind == 0:
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": words}], **common}
    if kind == 1:
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": words}], "stream": True,
                                        "stream_options": {"include_usage": True}, **common}
    if kind == 2:
        return "/v1/completions", {"prompt": words, **common}
    if kind == 3:
        return "/v1/completions", {"prompt": words, "stream": True, **common}
    return "/v1/chat/completions", {"messages": [{"role": "user", "content": words}], "stream": True,
                                    "max_tokens": 60, "temperature": 0}  # cancelled after its first token


def cancel_mid_stream(srv, path: str, body: dict) -> None:
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=120) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        data = b""
        while data.count(b'"content"') < 2:  # the role chunk, then the first token
            chunk = sock.recv(65536)
            assert chunk, "stream ended early"
            data += chunk


def run_one(srv, i: int) -> None:
    path, body = body_for(i)
    if i % 5 == 4:
        cancel_mid_stream(srv, path, body)
        return
    r = requests.post(srv.base_url + path, json=body, timeout=300, stream=bool(body.get("stream")))
    assert r.status_code == 200, r.text
    if not body.get("stream"):
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
        return
    lines = [line for line in r.iter_lines() if line.startswith(b"data: ")]
    assert lines[-1] == b"data: [DONE]"
    assert all(b'"error"' not in line for line in lines), lines


def run_batch(srv, indices: range) -> None:
    errors: list[BaseException] = []
    todo = list(indices)
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                if not todo or errors:
                    return
                i = todo.pop(0)
            try:
                run_one(srv, i)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    if errors:
        raise errors[0]


def test_memory_and_descriptors_stay_flat(soak_server):
    srv = soak_server
    pid = worker_pid(srv.proc.pid)
    t0 = time.monotonic()
    run_batch(srv, range(WARMUP))
    srv.wait_idle()
    time.sleep(0.5)  # let cancelled requests' greenlets finish
    rss0, fds0 = rss_kib(pid), open_fds(pid)
    samples = [rss0]
    for start in range(WARMUP, WARMUP + MEASURED, 100):
        run_batch(srv, range(start, start + 100))
        srv.wait_idle()
        samples.append(rss_kib(pid))
    time.sleep(0.5)
    rss1, fds1 = rss_kib(pid), open_fds(pid)
    assert worker_pid(srv.proc.pid) == pid, "the worker was replaced during the soak"
    health = srv.health()
    assert health["status"] == "ok" and health["engine"]["requests"] >= WARMUP + MEASURED * 4 // 5
    growth_mib = (rss1 - rss0) / 1024
    print(f"\nsoak: {WARMUP}+{MEASURED} requests in {time.monotonic() - t0:.0f} s; worker RSS after warm-up "
          f"{rss0 / 1024:.1f} MiB, per 100 requests {[round(s / 1024, 1) for s in samples]} MiB, "
          f"growth {growth_mib:+.1f} MiB; open fds {fds0} -> {fds1}")
    assert growth_mib < MAX_RSS_GROWTH_MIB
    assert fds1 - fds0 <= MAX_FD_GROWTH
