"""Bad requests get an OpenAI error envelope with a 4xx status, and the server keeps serving."""

from __future__ import annotations

import openai
import pytest
import requests


def assert_envelope(r: requests.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param
    return err


@pytest.mark.parametrize("body, status, param", [
    (b"{not json", 400, None),
    (b"", 400, None),
    (b"[1, 2]", 400, None),
    (b'{"messages": []}', 400, "messages"),
    (b'{"model": "x"}', 400, "messages"),
    (b'{"messages": [{"role": "wizard", "content": "hi"}]}', 400, "messages[0].role"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 3}', 400, "temperature"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400, None),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}', 400, "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "bogus_field": 1}', 400, "bogus_field"),
    (b'\xff\xfe{"messages": 1}', 400, None),
])
def test_bad_chat_requests(server, body, status, param):
    r = requests.post(server.base_url + "/v1/chat/completions", data=body,
                      headers={"Content-Type": "application/json"}, timeout=30)
    assert_envelope(r, status, param)


def test_unknown_route_and_method(server):
    assert_envelope(requests.get(server.base_url + "/v1/nothing-here", timeout=10), 404)
    assert_envelope(requests.get(server.base_url + "/v1/chat/completions", timeout=10), 405)


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/models", "/v1/models/{model}", "/props", "/slots",
                                  "/metrics", "/"])
def test_head_answers_as_get_does_without_a_body(server, path):
    """Uptime monitors and `curl -I` probe with HEAD: the status and type a GET gets, no body."""
    if "{model}" in path:
        path = path.format(model=requests.get(server.base_url + "/v1/models", timeout=10).json()["data"][0]["id"])
    got = requests.get(server.base_url + path, timeout=10)
    head = requests.head(server.base_url + path, timeout=10)
    assert got.status_code == 200, got.text
    assert head.status_code == got.status_code and head.content == b""
    assert head.headers["Content-Type"].split(";")[0] == got.headers["Content-Type"].split(";")[0]
    # a route that answers no GET still says so
    assert_envelope(requests.get(server.base_url + "/v1/chat/completions", timeout=10), 405)
    assert requests.head(server.base_url + "/v1/chat/completions", timeout=10).status_code == 405


def test_wrong_content_type(server):
    r = requests.post(server.base_url + "/v1/chat/completions", data="messages=hi",
                      headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=10)
    assert_envelope(r, 415)
    # `curl -d '{...}'` labels a JSON body as a form: read as JSON, as llama.cpp reads it
    r = requests.post(server.base_url + "/completion", data='{"prompt": "Hello", "n_predict": 2}',
                      headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=60)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2, r.text


def test_prompt_too_long_is_refused_before_streaming(server):
    long_text = "word " * 2000
    r = requests.post(server.base_url + "/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": long_text}], "stream": True})
    err = assert_envelope(r, 400)
    assert err["code"] == "context_length_exceeded"


def test_server_still_answers_after_bad_requests(server, served_model):
    requests.post(server.base_url + "/v1/chat/completions", data=b"{oops", timeout=10)
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=served_model.id, messages=[], max_tokens=4)
    r = client.chat.completions.create(model=served_model.id, max_tokens=4, temperature=0,
                                       messages=[{"role": "user", "content": "Hi"}])
    assert r.choices[0].message.content


def test_a_chunked_body_is_read_and_limited(server):
    """Transfer-Encoding: chunked (no Content-Length): gunicorn de-chunks it; the app reads it
    (it used to see an empty body) and still refuses one over the limit with its own 413."""
    import json

    body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}).encode()
    r = requests.post(server.base_url + "/v1/chat/completions", data=iter([body[:10], body[10:]]),
                      headers={"Content-Type": "application/json"}, timeout=120)
    assert r.request.headers.get("Transfer-Encoding") == "chunked"
    assert r.status_code == 200, r.text
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * (5 * 2**20) + b'"}]}'
    r = requests.post(server.base_url + "/v1/chat/completions",
                      data=(big[i:i + 2**20] for i in range(0, len(big), 2**20)),
                      headers={"Content-Type": "application/json"}, timeout=120)
    assert_envelope(r, 413)["code"] == "request_too_large"
    assert requests.get(server.base_url + "/health", timeout=5).json()["status"] == "ok"
