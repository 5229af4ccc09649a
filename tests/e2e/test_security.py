"""API keys and request ids, on a real server."""

from __future__ import annotations

import time

import openai
import pytest
import requests

KEY = "s3cret-test-key"
ROUTES = [("GET", "/v1/models"), ("GET", "/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
          ("POST", "/tokenize"), ("POST", "/v1/detokenize"), ("POST", "/apply-template"), ("GET", "/v1/nowhere")]


@pytest.fixture(scope="module")
def keyed_server(make_server):
    return make_server({"ETSERVE_API_KEY": KEY})


@pytest.mark.parametrize("method, path", ROUTES)
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"X-Api-Key": "wrong"},
                                     {"Authorization": KEY}])
def test_every_route_but_health_needs_the_key(keyed_server, method, path, headers):
    r = requests.request(method, keyed_server.base_url + path, headers=headers, timeout=10,
                         json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key" and KEY not in r.text


def test_health_stays_open_and_the_key_works(keyed_server, served_model):
    assert requests.get(keyed_server.base_url + "/health", timeout=5).status_code == 200
    assert requests.get(keyed_server.base_url + "/v1/models", headers={"X-Api-Key": KEY}, timeout=5).status_code == 200
    client = openai.OpenAI(base_url=keyed_server.base_url + "/v1", api_key=KEY, max_retries=0)
    r = client.chat.completions.create(model=served_model.id, max_tokens=2, temperature=0,
                                       messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content is not None
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed_server.base_url + "/v1", api_key="nope", max_retries=0).models.list()


def test_every_response_has_a_request_id(server):
    ok = requests.get(server.base_url + "/v1/models", timeout=5)
    bad = requests.post(server.base_url + "/v1/chat/completions", data=b"{", timeout=5)
    ids = {ok.headers["X-Request-Id"], bad.headers["X-Request-Id"]}
    assert len(ids) == 2 and all(ids)
    mine = requests.get(server.base_url + "/health", headers={"X-Request-Id": "abc-123"}, timeout=5)
    assert mine.headers["X-Request-Id"] == "abc-123"
    deadline = time.monotonic() + 5  # the access line is written just after the response
    while "rid=abc-123" not in server.log_path.read_text():
        assert time.monotonic() < deadline, "request id missing from the access log"
        time.sleep(0.05)
