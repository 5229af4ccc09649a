"""Error envelopes: every failure is {"error": {message, type, param, code}} with the right status."""

from __future__ import annotations

import io
import json
import threading

import falcon.testing
import pytest

from app.wsgi import build_app
from fakes.scripted import FakeModel

from .background import Background, engine_busy, wait_for
from .sse import events

HELLO = [{"role": "user", "content": "Hello"}]


def envelope(r, status: int, code: str | None = None, param: str | None = None) -> dict:
    """The error envelope of `r`; its code is `code` when given, else any non-empty string."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["code"] == code if code is not None else isinstance(error["code"], str) and error["code"]
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize("body, param, code", [
    ({"messages": HELLO, "temperature": "hot"}, "temperature", None),
    ({"messages": HELLO, "max_tokens": -2}, "max_tokens", None),
    ({"messages": HELLO, "n": 0}, "n", None),
    ({"messages": "Hello"}, "messages", None),
    ({"messages": HELLO, "frobnicate": True}, "frobnicate", None),
    ({"messages": [{"role": "user", "content": "x" * 1100}]}, "messages", "context_length_exceeded"),
    ({"messages": HELLO, "logit_bias": {"999999": 1}}, "logit_bias", None),
])
def test_bad_chat_requests_are_400(client, body, param, code):
    error = envelope(client.simulate_post("/v1/chat/completions", json=body), 400, code, param)
    assert error["type"] == "invalid_request_error"


def test_bad_json_and_media_type(client):
    envelope(client.simulate_post("/v1/chat/completions", body=b"{", headers={"Content-Type": "application/json"}),
             400, "invalid_json")
    envelope(client.simulate_post("/v1/chat/completions", body=b"", headers={"Content-Type": "application/json"}),
             400, "invalid_json")
    envelope(client.simulate_post("/v1/chat/completions", body=b"a=b", headers={"Content-Type": "text/plain"}),
             415, "unsupported_media_type")
    # a JSON body labelled as `curl -d` labels it is read as JSON, as llama.cpp's server reads it
    body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    for label in ("application/x-www-form-urlencoded", "text/plain; charset=utf-8"):
        r = client.simulate_post("/v1/chat/completions", body=body, headers={"Content-Type": label})
        assert r.status_code == 200, r.text
    envelope(client.simulate_post("/v1/chat/completions", body=b"{oops", headers={"Content-Type": "text/plain"}),
             415, "unsupported_media_type")
    envelope(client.simulate_post("/v1/chat/completions", body=body, headers={"Content-Type": "application/xml"}),
             415, "unsupported_media_type")


def test_token_prompt_outside_the_vocabulary(fake, client):
    limit = fake.tokenizer.vocab_size  # the model's logits cover more (extra_vocab): the smaller one wins
    envelope(client.simulate_post("/v1/completions", json={"prompt": [limit]}), 400, "invalid_value", "prompt")
    assert client.simulate_post("/v1/completions", json={"prompt": [limit - 1], "max_tokens": 1}).status_code == 200


def test_not_found(client):
    strict = FakeModel(settings={"ETSERVE_STRICT_MODEL_NAME": "1"}).client()
    envelope(strict.simulate_post("/v1/chat/completions", json={"messages": HELLO, "model": "gpt-9"}),
             404, "model_not_found", "model")
    envelope(client.simulate_get("/v1/nowhere"), 404, "not_found")
    envelope(client.simulate_delete("/v1/chat/completions"), 405, "method_not_allowed")


def test_the_apps_own_413():
    fake = FakeModel(settings={"ETSERVE_MAX_BODY_BYTES": "1000"})
    client = fake.client()
    big = {"messages": [{"role": "user", "content": "x" * 2000}]}
    envelope(client.simulate_post("/v1/chat/completions", json=big), 413, "request_too_large")
    envelope(client.simulate_post("/v1/completions", json={"prompt": "x" * 2000}), 413, "request_too_large")
    envelope(client.simulate_post("/tokenize", json={"content": "x" * 2000}), 413, "request_too_large")
    # no Content-Length (a chunked body): the app counts what it reads
    body = b'{"messages": [{"role": "user", "content": "' + b"x" * 2000 + b'"}]}'
    environ = falcon.testing.create_environ(method="POST", path="/v1/chat/completions",
                                            headers={"Content-Type": "application/json"})
    environ.pop("CONTENT_LENGTH", None)
    environ["wsgi.input"] = io.BytesIO(body)
    environ["wsgi.input_terminated"] = True  # the server de-chunked the body: read to its end
    status = []
    out = b"".join(fake.app()(environ, lambda s, h, e=None: status.append(s)))
    assert status[0].startswith("413"), (status, out)
    assert b"request_too_large" in out
    assert fake.runtime.forward_calls == 0
    # and a chunked body within the limit is read (not taken for an empty one)
    environ["wsgi.input"] = io.BytesIO(b'{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1}')
    status.clear()
    out = b"".join(fake.app()(environ, lambda s, h, e=None: status.append(s)))
    assert status[0].startswith("200"), (status, out)


def test_queue_full_is_429_with_retry_after():
    fake = FakeModel(settings={"ETSERVE_MAX_QUEUE": "1", "ETSERVE_PARALLEL": "1"})  # one slot: the next request waits
    client = fake.client()
    with engine_busy(fake, client) as running:
        waiting = Background(lambda: client.simulate_post("/v1/chat/completions", json={"messages": HELLO}))
        wait_for(lambda: fake.engine.waiting == 1)
        for path, body in (("/v1/chat/completions", {"messages": HELLO}), ("/v1/completions", {"prompt": "Hi"}),
                           ("/v1/chat/completions", {"messages": HELLO, "stream": True})):
            r = client.simulate_post(path, json=body)
            envelope(r, 429, "queue_full")
            assert int(r.headers["Retry-After"]) > 0
            assert r.json["error"]["type"] == "rate_limit_error"
    assert running.result().status_code == 200 and waiting.result().status_code == 200


def test_queue_timeout_is_503():
    fake = FakeModel(settings={"ETSERVE_QUEUE_TIMEOUT": "1", "ETSERVE_PARALLEL": "1"})
    client = fake.client()
    with engine_busy(fake, client) as running:
        r = client.simulate_post("/v1/chat/completions", json={"messages": HELLO})
        error = envelope(r, 503, "queue_timeout")
        assert error["type"] == "server_error" and int(r.headers["Retry-After"]) > 0
        # a stream has sent its headers by then: the timeout is an error event, then [DONE]
        streamed = events(client.simulate_post("/v1/chat/completions",
                                               json={"messages": HELLO, "stream": True}).text)
        assert streamed[-1]["error"]["code"] == "queue_timeout"
        assert fake.engine.waiting == 0
    assert running.result().status_code == 200
    assert len(fake.runtime.prompts) == 1  # the timed-out requests never ran
    # their waits are in the queue-wait histogram (the longest waits of all), not as generations
    metrics = client.simulate_get("/metrics").text
    value = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
             if line and not line.startswith("#")}
    assert value["etserve_queue_wait_seconds_count"] == 3 and value["etserve_generations_total"] == 1
    assert value['etserve_queue_wait_seconds_bucket{le="0.5"}'] == 1  # the one that ran waited no time


def test_503_while_the_model_loads_or_failed():
    fake = FakeModel()
    go = threading.Event()

    def slow_loader():
        assert go.wait(10)
        return fake.served

    client = falcon.testing.TestClient(build_app(fake.app_settings, slow_loader))
    for path in ("/v1/models", "/v1/chat/completions"):
        r = client.simulate_post(path, json={"messages": HELLO}) if "chat" in path else client.simulate_get(path)
        envelope(r, 503, "model_loading")
        assert r.headers["Retry-After"]
    assert client.simulate_get("/health").status_code == 503
    go.set()
    wait_for(lambda: client.simulate_get("/health").status_code == 200)

    def broken_loader():
        raise OSError("no model at /nowhere/model.pte")

    client = falcon.testing.TestClient(build_app(fake.app_settings, broken_loader))
    wait_for(lambda: client.simulate_get("/health").json["status"] == "failed")
    envelope(client.simulate_get("/v1/models"), 503, "model_failed")


def test_a_runtime_failure_is_a_500_and_a_stream_error_event(fake, client):
    fake.runtime.fail_next_forward = "tensor shapes do not match"
    r = client.simulate_post("/v1/chat/completions", json={"messages": HELLO})
    error = envelope(r, 500, "runtime_error")
    assert "tensor" not in error["message"]  # internals are logged, not sent
    fake.runtime.fail_next_forward = "tensor shapes do not match"
    chunks = events(client.simulate_post("/v1/chat/completions", json={"messages": HELLO, "stream": True}).text)
    assert chunks[-1]["error"]["code"] == "runtime_error"
    # the engine recovers: the next request runs from a clean cache
    assert client.simulate_post("/v1/chat/completions", json={"messages": HELLO}).json["choices"][0]["message"]


@pytest.mark.parametrize("headers, ok", [
    ({"Content-Type": "application/json; charset=utf-8"}, True),
    ({"Content-Type": 'application/json; charset="UTF-8"'}, True),
    ({"Content-Type": "application/json;charset=utf-16"}, False),
    ({"Content-Type": "application/json; charset=latin-1"}, False),
    ({"Content-Type": "application/json", "Content-Encoding": "identity"}, True),
    ({"Content-Type": "application/json", "Content-Encoding": "gzip"}, False),
    ({"Content-Type": "application/json", "Content-Encoding": "br"}, False),
])
def test_a_body_in_another_charset_or_compressed_is_a_415_that_says_so(client, headers, ok):
    """Found by fuzzing: a gzip body got 'not valid UTF-8', and charset=utf-16 was decoded as UTF-8."""
    body = json.dumps({"messages": HELLO, "max_tokens": 1}).encode()
    r = client.simulate_post("/v1/chat/completions", body=body, headers=headers)
    if ok:
        assert r.status_code == 200, r.text
    else:
        error = envelope(r, 415, "unsupported_media_type")
        assert ("charset" in error["message"]) != ("Content-Encoding" in error["message"])
