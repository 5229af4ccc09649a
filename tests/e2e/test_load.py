"""Load: 8 concurrent clients, 200 requests, streaming and not; each completes correctly or gets a clean 429/503."""

from __future__ import annotations

import json
import threading
import time

import requests

CLIENTS = 8
PER_CLIENT = 25
# Questions whose greedy answers differ, so an answer handed to the wrong client shows
PROMPTS = [
    "What is the capital of France?",
    "What colour is the sky on a clear day?",
    "How many legs does a spider have?",
    "Which planet is the largest in our solar system?",
    "What do bees make?",
    "What is the opposite of hot?",
    "Which animal says moo?",
    "What is frozen water called?",
]
MAX_TOKENS = 6  # SmolLM2 greedy answers already differ at 5 tokens


def ask(server, prompt: str, stream: bool) -> tuple[int, str | None]:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS, "temperature": 0,
            "stream": stream}
    r = requests.post(server.base_url + "/v1/chat/completions", json=body, timeout=600, stream=stream)
    if r.status_code != 200:
        return r.status_code, None
    if not stream:
        return 200, r.json()["choices"][0]["message"]["content"]
    text, done = "", False
    for line in r.iter_lines():
        if line == b"data: [DONE]":
            done = True
        elif line.startswith(b"data: "):  # other lines: SSE comments (keep-alives)
            payload = json.loads(line[6:])
            assert "error" not in payload, payload
            for c in payload["choices"]:
                text += c["delta"].get("content") or ""
    assert done, "stream ended without [DONE]"
    return 200, text


def test_concurrent_clients_get_their_own_answers(server):
    expected = {p: ask(server, p, False)[1] for p in PROMPTS}
    assert len(set(expected.values())) == CLIENTS, expected  # each client's answer is its own
    results: list[tuple[int, int, bool, int, str | None]] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        for k in range(PER_CLIENT):
            stream = (c + k) % 2 == 0
            status, text = ask(server, PROMPTS[c], stream)
            with lock:
                results.append((c, k, stream, status, text))

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=1200)
    elapsed = time.monotonic() - t0
    assert len(results) == CLIENTS * PER_CLIENT
    refused = [r for r in results if r[3] in (429, 503)]
    served = [r for r in results if r[3] == 200]
    assert len(served) + len(refused) == len(results), {r[3] for r in results}
    for c, k, stream, _, text in served:
        assert text == expected[PROMPTS[c]], (c, k, stream, text)
    assert len(served) >= len(results) // 2
    print(f"{len(results)} requests from {CLIENTS} clients in {elapsed:.1f}s: "
          f"{len(served)} served, {len(refused)} refused (429/503)")
    assert server.health()["status"] == "ok"
