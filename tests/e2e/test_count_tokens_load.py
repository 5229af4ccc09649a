"""count_tokens with a multi-megabyte body is counted off the event loop: the server keeps
answering others meanwhile, and only two such requests are worked on at once (a third: 429)."""

from __future__ import annotations

import threading
import time

import requests


def _big_body(mib: float) -> dict:
    words = int(mib * 1024 * 1024 / 6)
    return {"messages": [{"role": "user", "content": "hello " * words}]}


def test_a_huge_count_tokens_does_not_stall_the_server(server):
    url = server.base_url
    results: list = []
    body = _big_body(3.5)

    def count():
        results.append(requests.post(url + "/v1/messages/count_tokens", json=body, timeout=300))

    threads = [threading.Thread(target=count) for _ in range(3)]
    for t in threads:
        t.start()
    slowest = 0.0
    while any(t.is_alive() for t in threads):
        start = time.monotonic()
        assert requests.get(url + "/health", timeout=30).status_code == 200
        slowest = max(slowest, time.monotonic() - start)
        time.sleep(0.05)
    for t in threads:
        t.join()
    statuses = sorted(r.status_code for r in results)
    assert statuses in ([200, 200, 200], [200, 200, 429]), [r.text[:200] for r in results]
    for r in results:
        if r.status_code == 200:
            assert r.json()["input_tokens"] > 500_000
        else:
            assert r.json()["type"] == "error" and r.headers["Retry-After"]
    assert slowest < 2.0, f"/health took {slowest:.2f} s while count_tokens ran"


def test_a_huge_chat_prompt_does_not_stall_the_server(server):
    """A 3.5 MB conversation is far past the context (a 400), but finding that out means
    tokenizing it: off the event loop, /health answers meanwhile."""
    url = server.base_url
    results: list = []
    body = {**_big_body(3.5), "max_tokens": 1}
    threads = [threading.Thread(target=lambda: results.append(
        requests.post(url + "/v1/chat/completions", json=body, timeout=300))) for _ in range(2)]
    for t in threads:
        t.start()
    slowest = 0.0
    while any(t.is_alive() for t in threads):
        start = time.monotonic()
        assert requests.get(url + "/health", timeout=30).status_code == 200
        slowest = max(slowest, time.monotonic() - start)
        time.sleep(0.05)
    assert [r.json()["error"]["code"] for r in results] == ["context_length_exceeded"] * 2
    assert slowest < 2.0, f"/health took {slowest:.2f} s while the chat prompts were tokenized"


def test_a_huge_tokenize_does_not_stall_the_server(server):
    """/tokenize of 3.5 MB of varied words (some seconds of tokenizing): off the event loop too."""
    url = server.base_url
    results: list = []
    body = {"content": "".join(f"w{i} x{i * 7 % 1000} " for i in range(300_000))}
    thread = threading.Thread(target=lambda: results.append(requests.post(url + "/tokenize", json=body, timeout=300)))
    thread.start()
    slowest = 0.0
    while thread.is_alive():
        start = time.monotonic()
        assert requests.get(url + "/health", timeout=30).status_code == 200
        slowest = max(slowest, time.monotonic() - start)
        time.sleep(0.05)
    thread.join()
    assert results[0].status_code == 200 and len(results[0].json()["tokens"]) > 500_000
    assert slowest < 2.0, f"/health took {slowest:.2f} s while /tokenize ran"
