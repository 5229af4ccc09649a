"""Sequence slots, served for real: several requests in flight at once on one weight load, each
in a KV state of its own, taking turns a forward step at a time (app/engine/slots.py, steps.py,
scheduler.py; native/src/kv_slots.cpp).

- Greedy output of every request is what it is alone, whatever the interleaving (chat, infill,
  Responses and Messages at once, on the default model with its int8 KV cache).
- A short request that arrives during a long prompt is served before the long one ends.
- A long request finishes while short ones keep arriving (the scheduler's bound on waiting).
- Slots and the wait queue: 429 only when every slot is busy and the queue is full.
- GET /slots and /health show the slots; /metrics their state and the steps handed over.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests

from .streams import LONG, open_stream, read_events

FILLER = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(120))


def wait_for(predicate, timeout: float = 120.0, what: str = "condition not reached") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def chat(srv, content: str, max_tokens: int, **kw) -> dict:
    r = requests.post(srv.base_url + "/v1/chat/completions", timeout=600, json={
        "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


# -- the mixed requests of the identity test, each as (name, call) returning its output text
def _chat(srv):
    return chat(srv, "Write a Python function that reverses a string, with a docstring.", 48)[
        "choices"][0]["message"]["content"]


def _infill(srv):
    r = requests.post(srv.base_url + "/infill", timeout=600, json={
        "input_prefix": "def mean(xs):\n    ", "input_suffix": "\n\nprint(mean([1, 2, 3]))\n",
        "n_predict": 32, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["content"]


def _responses(srv):
    r = requests.post(srv.base_url + "/v1/responses", timeout=600, json={
        "model": "m", "input": "List three prime numbers and say why each is prime.", "max_output_tokens": 48,
        "temperature": 0})
    assert r.status_code == 200, r.text
    return "".join(c["text"] for item in r.json()["output"] if item["type"] == "message" for c in item["content"])


def _messages(srv):
    r = requests.post(srv.base_url + "/v1/messages", timeout=600, headers={"anthropic-version": "2023-06-01"},
                      json={"model": "m", "max_tokens": 48, "temperature": 0,
                            "messages": [{"role": "user", "content": "Explain what a hash map is in two sentences."}]})
    assert r.status_code == 200, r.text
    return "".join(b["text"] for b in r.json()["content"] if b["type"] == "text")


def _long_chat(srv):
    return chat(srv, "Summarize this text in one sentence:\n" + FILLER[:2500], 40)["choices"][0]["message"]["content"]


MIXED = [("chat", _chat), ("infill", _infill), ("responses", _responses), ("messages", _messages),
         ("long_chat", _long_chat)]


def steps_shared(srv) -> float:
    text = requests.get(srv.base_url + "/metrics", timeout=30).text
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("etserve_steps_shared_total"))


def steps_handed_over(srv) -> float:
    text = requests.get(srv.base_url + "/metrics", timeout=30).text
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("etserve_step_handovers_total"))


def _together(srv) -> tuple[dict[str, str], int]:
    """Every MIXED request at once: their outputs, and the most slots busy at one time."""
    most_busy = 0
    out: dict[str, str] = {}
    errors: list[BaseException] = []

    def run(name, call):
        try:
            out[name] = call(srv)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=item) for item in MIXED]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        most_busy = max(most_busy, srv.health()["engine"]["slots"]["busy"])
        time.sleep(0.02)
    assert not errors, errors
    return out, most_busy


def test_concurrent_mixed_requests_give_their_output_alone(make_server, qwen_dir):
    """The default model with its int8 KV cache. The prompts are read once first (all at once), and
    there are slots to spare (none is overwritten), so that alone and together alike find each
    prompt in a slot and compute the same steps: what is compared is the interleaving, not a cold
    prompt against a cached one (a prefill chunk and a decode step round differently)."""
    # whole prefill chunks whatever the host's load (--prefill-step-ms 0): shrunken chunks would
    # read a prompt in other steps, which round differently
    srv = make_server({"ETSERVE_MODEL_PATH": str(qwen_dir), "ETSERVE_PARALLEL": str(4 * len(MIXED)),
                       "ETSERVE_PREFILL_STEP_MS": "0"})
    _together(srv)
    alone = {name: call(srv) for name, call in MIXED}
    assert all(alone.values()), alone
    before, shared_before = steps_handed_over(srv), steps_shared(srv)
    together, most_busy = _together(srv)
    assert most_busy >= 3, "the requests never ran side by side"
    # their steps interleaved (handed over between sequences) or went together (batched decode)
    assert steps_handed_over(srv) - before + steps_shared(srv) - shared_before >= 3
    assert steps_shared(srv) > shared_before, "no decode step went along in another's forward call"
    assert together == alone
    srv.stop()  # a Qwen server with 20 slots: not kept for the rest of the module


def test_a_short_request_during_a_long_prompt_is_served_first(make_server, model_dir):
    """A chat turn arrives while a long prompt is being read (small prefill chunks, so reading it
    takes many steps): it finishes while the long request is still in flight."""
    srv = make_server({"ETSERVE_PREFILL_CHUNK": "8"})
    events: list[str] = []
    long_body = {"messages": [{"role": "user", "content": "Summarize:\n" + FILLER[:1200]}], "max_tokens": 24,
                 "temperature": 0}

    def long_request():
        chat(srv, long_body["messages"][0]["content"], 24)
        events.append("long")

    t = threading.Thread(target=long_request)
    t.start()
    wait_for(lambda: any(s["task"] == "prefill" and (s["prompt_processed"] or 0) > 16
                         for s in requests.get(srv.base_url + "/slots", timeout=30).json()),
             what="the long prompt was never being read")
    reply = chat(srv, "Say hi.", 4)
    events.append("short")
    t.join(300)
    assert events == ["short", "long"]
    assert reply["usage"]["completion_tokens"] >= 1


def test_a_long_request_finishes_while_short_ones_keep_arriving(make_server):
    """Short requests back to back from two clients for as long as the long one runs: it still
    ends, and streams all the while (the scheduler's bound on waiting, 0.3 s here)."""
    srv = make_server({"ETSERVE_SCHED_MAX_WAIT": "0.3", "ETSERVE_PREFILL_CHUNK": "16"})
    done = threading.Event()
    shorts = [0]

    def hammer():
        while not done.is_set():
            chat(srv, "Count to three.", 8)
            shorts[0] += 1

    sock = open_stream(srv, {**LONG, "max_tokens": 120, "stream": True})
    read_events(sock, 1)
    hammers = [threading.Thread(target=hammer) for _ in range(2)]
    for h in hammers:
        h.start()
    try:
        data, deadline = b"", time.monotonic() + 300
        while b"data: [DONE]" not in data:
            assert time.monotonic() < deadline, "the long request starved"
            chunk = sock.recv(65536)
            assert chunk, "stream ended early"
            data += chunk
    finally:
        done.set()
        sock.close()
        for h in hammers:
            h.join(120)
    assert shorts[0] >= 4  # they kept coming while it ran
    assert b'"finish_reason":"length"' in data.replace(b" ", b"")


def test_429_only_when_every_slot_is_busy_and_the_queue_is_full(make_server):
    srv = make_server({"ETSERVE_PARALLEL": "2", "ETSERVE_MAX_QUEUE": "1"})
    url = srv.base_url + "/v1/chat/completions"
    running = [open_stream(srv, {**LONG, "max_tokens": 400, "stream": True}) for _ in range(2)]
    try:
        for sock in running:
            read_events(sock, 1)
        health = srv.health()["engine"]
        assert health["slots"] == {**health["slots"], "total": 2, "busy": 2}
        slots = requests.get(srv.base_url + "/slots", timeout=30).json()
        assert [s["state"] for s in slots] == ["busy", "busy"] and all(s["task"] == "decode" for s in slots)
        assert all(s["is_processing"] is True and s["id_task"] >= 0 for s in slots)  # llama.cpp's fields
        assert all(s["n_ctx_used"] > 0 and s["n_ctx"] > s["n_ctx_used"] for s in slots)
        results = {}
        waiter = threading.Thread(target=lambda: results.setdefault("w", requests.post(url, timeout=300, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0})))
        waiter.start()
        wait_for(lambda: srv.health()["engine"]["waiting"] == 1)
        r = requests.post(url, timeout=30, json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
        running[0].close()  # a slot frees: the waiter takes it
        waiter.join(120)
        assert results["w"].status_code == 200
    finally:
        for sock in running:
            sock.close()
    srv.wait_idle()
    metrics = requests.get(srv.base_url + "/metrics", timeout=30).text
    assert "etserve_slots 2.0" in metrics and 'etserve_slot_busy{slot="1",task="idle"} 0.0' in metrics
    assert "etserve_queue_wait_seconds_count" in metrics


def test_a_slot_keeps_its_conversation_for_the_next_turn(make_server):
    """Two conversations alternate on a two-slot server: each next turn reads only its new tokens,
    because its previous turn's slot still holds the rest."""
    srv = make_server({"ETSERVE_PARALLEL": "2", "ETSERVE_SESSION_CACHE_MIB": "0"})
    histories = {"a": "Tell me about apples. " * 20, "b": "Tell me about boats. " * 20}
    for turn in range(2):
        for text in histories.values():
            usage = chat(srv, text, 8)["usage"]
            if turn > 0:  # all but the last prompt token, from its own slot
                assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1, usage
    slots = requests.get(srv.base_url + "/slots", timeout=30).json()
    assert sorted(s["n_ctx_used"] > 0 for s in slots) == [True, True]
    assert all(s["is_processing"] is False and s["id_task"] == -1 for s in slots)


def _progress(srv, content: str) -> list[int]:
    """The `processed` counts of a streamed chat's prompt_progress chunks."""
    import json

    r = requests.post(srv.base_url + "/v1/chat/completions", stream=True, timeout=300, json={
        "messages": [{"role": "user", "content": content}], "max_tokens": 1, "temperature": 0, "stream": True,
        "return_progress": True})
    assert r.status_code == 200, r.text
    out = []
    for line in r.iter_lines():
        if line.startswith(b"data: {"):
            chunk = json.loads(line[6:])
            if chunk.get("prompt_progress"):
                out.append(chunk["prompt_progress"]["processed"])
    return out


def test_prefill_steps_shrink_when_a_chunk_would_take_too_long(make_server):
    """--prefill-step-ms: a step of --prefill-chunk tokens that takes longer than it is followed by
    shorter ones (here 1 ms: every later step reads 16 tokens), so a request that arrives during a
    long prompt on a slow CPU soon gets its turn; 0 keeps every step at --prefill-chunk."""
    text = "Summarize:\n" + FILLER[:900]
    quick = make_server({"ETSERVE_PREFILL_CHUNK": "64", "ETSERVE_PREFILL_STEP_MS": "1"})
    processed = _progress(quick, "y " + text)
    steps = [b - a for a, b in zip(processed, processed[1:])]
    assert steps[0] == 64 and set(steps[1:-1]) == {16}, steps
    fixed = make_server({"ETSERVE_PREFILL_CHUNK": "64", "ETSERVE_PREFILL_STEP_MS": "0"})
    processed = _progress(fixed, "z " + text)
    steps = [b - a for a, b in zip(processed, processed[1:])]
    assert set(steps[:-1]) == {64}, steps


def test_an_editors_next_infill_supersedes_the_one_in_flight(qwen_server):
    """llama.vscode sends an /infill at every pause in typing: the one still streaming is worthless
    once the next arrives. The older stream ends early, the newer reads only what is new."""
    import json

    srv = qwen_server
    srv.wait_idle()
    prefix = "import math\n\n" + "".join(f"def f{i}(x):\n    return math.sqrt(x) + {i}\n\n" for i in range(30))
    body = {"input_prefix": prefix + "def g(x):\n    ", "input_suffix": "\n", "n_predict": 400, "temperature": 0,
            "stream": True}
    older = requests.post(srv.base_url + "/infill", json=body, stream=True, timeout=300)
    lines = older.iter_lines()
    assert any(line.startswith(b"data: ") for line in lines)  # it is generating
    newer = requests.post(srv.base_url + "/infill", timeout=300, json={
        **body, "input_prefix": body["input_prefix"] + "return", "n_predict": 8, "stream": False})
    assert newer.status_code == 200, newer.text
    rest = [json.loads(line[6:]) for line in lines if line.startswith(b"data: ")]
    generated = sum(1 for chunk in rest if chunk.get("content"))
    assert generated < 300 and not any(chunk.get("stop") for chunk in rest)  # cut off, no final chunk
    assert newer.json()["tokens_cached"] > 300  # the older's prompt, still in its slot
    # another client (another User-Agent) does not cancel anyone's
    other = requests.post(srv.base_url + "/infill", json={**body, "n_predict": 40}, stream=True, timeout=300,
                          headers={"User-Agent": "another-editor"})
    third = requests.post(srv.base_url + "/infill", timeout=300, json={**body, "n_predict": 4, "stream": False})
    chunks = [json.loads(line[6:]) for line in other.iter_lines() if line.startswith(b"data: ")]
    assert third.status_code == 200 and chunks[-1].get("stop") is True
