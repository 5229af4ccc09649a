"""A native runtime error fails only its own request: a 500 envelope, or an error event then
[DONE] on a stream; nothing internal leaks; the next request's output is the normal greedy
output (the engine forgets its cached prefix, which the failed call may have overwritten).

The fault is real native-call failure injected by the test-only hook in app/engine/faults.py:
every forward call carrying FAULT_WORD's token overwrites the KV cache, then fails.
"""

from __future__ import annotations

import json

import pytest
import requests

from app.text.tokenizer import Tokenizer

FAULT_WORD = " giraffe"  # one token in the test model's vocabulary
PROMPT = "The capital of France is Paris. The capital of Italy is"
MESSAGES = [{"role": "user", "content": "Name three fruits."}]


@pytest.fixture(scope="module")
def fault_token(model_dir) -> int:
    ids = Tokenizer.from_dir(model_dir).encode(FAULT_WORD, add_bos=False)
    assert len(ids) == 1
    return ids[0]


@pytest.fixture(scope="module")
def fault_server(make_server, fault_token):
    return make_server({"ETSERVE_FAULT_INJECT": f"forward_fail_on_token:{fault_token}"})


def post(srv, path: str, body: dict, **kw) -> requests.Response:
    return requests.post(srv.base_url + path, json=body, timeout=120, **kw)


def assert_runtime_error_envelope(err: dict) -> None:
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "server_error" and err["code"] == "runtime_error"
    text = json.dumps(err)
    for leak in ("Traceback", "injected", ".py", "/", "giraffe", "native"):
        assert leak not in text, f"{leak!r} leaked: {text}"


def sse_data(r: requests.Response) -> list[str]:
    return [line[len("data: "):] for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]


@pytest.fixture(scope="module")
def baseline(fault_server):
    """Normal greedy outputs; that they succeed shows the hook fires on its token only."""
    completion = post(fault_server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    chat = post(fault_server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 8, "temperature": 0})
    assert completion.status_code == 200 and chat.status_code == 200
    return completion.json()["choices"][0]["text"], chat.json()["choices"][0]["message"]["content"]


def test_prefill_failure_is_a_500_and_the_next_request_recomputes_the_prompt(fault_server, fault_token, baseline):
    srv = fault_server
    prompt_ids = post(srv, "/tokenize", {"content": PROMPT}).json()["tokens"]
    assert fault_token not in prompt_ids
    post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})  # cache holds PROMPT
    # PROMPT is reused from the cache, then the chunk with the fault token fails after scribbling on the cache
    r = post(srv, "/v1/completions", {"prompt": prompt_ids + [fault_token], "max_tokens": 8, "temperature": 0})
    assert r.status_code == 500 and r.headers["content-type"].startswith("application/json")
    assert_runtime_error_envelope(r.json()["error"])
    assert srv.health()["status"] == "ok"
    again = post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}).json()
    assert again["choices"][0]["text"] == baseline[0]


def test_chat_failure_mid_stream_is_an_error_event_then_done(fault_server, fault_token, baseline):
    srv = fault_server
    # +100 bias: the first token sampled is the fault token, whose forward call then fails
    body = {"messages": MESSAGES, "max_tokens": 8, "temperature": 0, "stream": True,
            "logit_bias": {str(fault_token): 100}}
    with post(srv, "/v1/chat/completions", body, stream=True) as r:
        assert r.status_code == 200
        data = sse_data(r)
    assert data[-1] == "[DONE]"
    events = [json.loads(d) for d in data[:-1]]
    assert "error" in events[-1], events
    assert_runtime_error_envelope(events[-1]["error"])
    content = "".join(c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"])
    assert FAULT_WORD.strip() in content  # the sampled token went out before the failure
    after = post(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 8, "temperature": 0}).json()
    assert after["choices"][0]["message"]["content"] == baseline[1]


def test_completion_stream_and_non_stream_failures(fault_server, fault_token, baseline):
    srv = fault_server
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logit_bias": {str(fault_token): 100}}
    r = post(srv, "/v1/completions", body)
    assert r.status_code == 500
    assert_runtime_error_envelope(r.json()["error"])
    with post(srv, "/v1/completions", {**body, "stream": True}, stream=True) as r:
        data = sse_data(r)
    assert data[-1] == "[DONE]"
    last = json.loads(data[-2])
    assert_runtime_error_envelope(last["error"])
    assert any(json.loads(d).get("choices") for d in data[:-2])  # text went out before the error
    for _ in range(2):
        ok = post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == baseline[0]
