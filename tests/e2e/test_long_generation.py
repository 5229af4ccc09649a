"""/health's prompt_progress while a long prompt is read, and --context-shift over HTTP,
on real servers with the test model (a 512-token context)."""

from __future__ import annotations

import json
import threading
import time

import requests

from .servers import Server

STORY = "The lighthouse keeper climbed the stairs at dusk and lit the lamp for the ships. " * 60


def test_health_shows_the_prompt_being_read(model_dir, make_server):
    srv: Server = make_server({"ETSERVE_PREFILL_CHUNK": "4"})  # many small chunks: a slow, visible prefill
    assert srv.health()["engine"]["prompt_progress"] is None
    result = {}

    def ask():
        r = requests.post(srv.base_url + "/v1/completions", timeout=120,
                          json={"prompt": STORY[:1900], "max_tokens": 1, "temperature": 0})
        result["response"] = r

    thread = threading.Thread(target=ask)
    thread.start()
    seen = []
    while thread.is_alive():
        progress = srv.health()["engine"]["prompt_progress"]
        if progress is not None:
            seen.append(progress)
        time.sleep(0.005)
    thread.join()
    r = result["response"]
    assert r.status_code == 200, r.text
    prompt_tokens = r.json()["usage"]["prompt_tokens"]
    assert len(seen) >= 3, seen
    assert all(p["total"] == prompt_tokens and set(p) == {"total", "cache", "processed", "time_ms"} for p in seen)
    processed = [p["processed"] for p in seen]
    assert processed == sorted(processed) and processed[-1] > processed[0]
    assert all(p["cache"] <= p["processed"] <= p["total"] for p in seen)
    assert srv.health()["engine"]["prompt_progress"] is None


def bias_against(served_model) -> dict[str, int]:
    return {str(t): -100 for t in served_model.stop_token_ids}


def _tokens(server, text: str) -> int:
    return len(requests.post(server.base_url + "/tokenize", json={"content": text}, timeout=10).json()["tokens"])


def test_max_tokens_past_the_context_is_cut_to_the_room_left(server, served_model):
    """Agents ask 32,000 tokens whatever the model (opencode without a `limit`): generation runs to
    the context's end and finishes with "length", as llama.cpp's and Ollama's do; never a 400."""
    context = requests.get(server.base_url + "/v1/models", timeout=10).json()["data"][0]["context_length"]
    prompt = STORY[:2300]
    room = context - _tokens(server, prompt)
    assert 0 < room < 100, room  # a short generation: the prompt nearly fills the context
    bias = bias_against(served_model)
    r = requests.post(server.base_url + "/v1/completions", timeout=120,
                      json={"prompt": prompt, "max_tokens": 32000, "temperature": 0, "logit_bias": bias})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["usage"]["completion_tokens"] == room and out["choices"][0]["finish_reason"] == "length"
    # chat, streamed: the same cut
    r = requests.post(server.base_url + "/v1/chat/completions", timeout=120, stream=True, json={
        "messages": [{"role": "user", "content": prompt[:2100]}], "max_completion_tokens": 32000,
        "temperature": 0, "logit_bias": bias, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200, r.text
    chunks = [json.loads(line[6:]) for line in r.iter_lines(decode_unicode=True)
              if line.startswith("data: {")]
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == context
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    # the Responses API's max_output_tokens too
    r = requests.post(server.base_url + "/v1/responses", timeout=120, json={
        "input": prompt[:2100], "max_output_tokens": 32000, "temperature": 0})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["input_tokens"] + usage["output_tokens"] <= context
    # a prompt the context cannot hold is still refused, and says how long it is
    r = requests.post(server.base_url + "/v1/completions", timeout=60, json={"prompt": STORY * 3, "max_tokens": 5})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "requested" not in r.json()["error"]["message"]


def test_context_shift_generates_past_the_end_of_the_context(make_server, served_model):
    body = {"prompt": "Once upon a time", "max_tokens": 700, "temperature": 0,
            "logit_bias": bias_against(served_model)}

    srv = make_server({"ETSERVE_CONTEXT_SHIFT": "1"})
    r = requests.post(srv.base_url + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()
    context = requests.get(srv.base_url + "/v1/models", timeout=10).json()["data"][0]["context_length"]
    assert out["usage"]["completion_tokens"] == 700 > context
    assert out["choices"][0]["finish_reason"] == "length"
    # a prompt that does not fit is still refused
    r = requests.post(srv.base_url + "/v1/completions", timeout=60,
                      json={"prompt": STORY * 3, "max_tokens": 5})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
