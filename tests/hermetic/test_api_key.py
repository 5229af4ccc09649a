"""The API key on every route the app has (found from its router, so a new route is covered too)."""

from __future__ import annotations

import falcon.inspect
import pytest

from fakes.scripted import FakeModel

KEY = "s3cret-test-key"
OPEN = {"/health", "/", "/metrics"}  # /metrics: metrics_auth "open" (the default)
BODY = {"messages": [{"role": "user", "content": "Hello"}], "prompt": "Hi", "content": "Hi", "tokens": [1],
        "max_tokens": 1}
SESSION_TURN = {"messages": [{"role": "user", "content": "Hello"}], "session_id": "s1"}


@pytest.fixture(scope="module")
def keyed():
    fake = FakeModel(settings={"ETSERVE_API_KEY": KEY})
    app = fake.app()
    yield fake, falcon.testing.TestClient(app), app
    fake.close()


def routes(app) -> list[tuple[str, str]]:
    out = []
    for route in falcon.inspect.inspect_routes(app):
        path = route.path.replace("{model_id}", "fake-model").replace("{session_id}", "s1") \
            .replace("{response_id}", "resp_1")
        out += [(m.method, path) for m in route.methods if not m.internal]
    return out


def test_the_route_list_is_complete(keyed):
    _, _, app = keyed
    found = routes(app)
    for prefix in ("/v1", ""):  # the unprefixed aliases are routes of their own
        for method, path in [("GET", "/models/fake-model"), ("GET", "/sessions"), ("DELETE", "/sessions/s1"),
                             ("POST", "/chat/completions"), ("POST", "/tokenize")]:
            assert (method, prefix + path) in found
    assert len(found) >= 21


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"X-Api-Key": "wrong"},
                                     {"Authorization": KEY}, {"Authorization": "Basic " + KEY}])
def test_every_route_but_the_open_ones_needs_the_key(keyed, headers):
    fake, client, app = keyed
    checked = 0
    for method, path in routes(app):
        if path in OPEN:
            continue
        r = client.simulate_request(method, path, json=BODY, headers=headers)
        assert r.status_code == 401, (method, path, r.status_code)
        if method == "HEAD":  # GET's answer without its body
            assert r.content == b"" and r.headers["WWW-Authenticate"] == "Bearer"
            continue
        if "/messages" in path:  # the Messages API answers in Anthropic's shape
            assert r.json["type"] == "error" and r.json["error"]["type"] == "authentication_error"
        else:
            assert r.json["error"]["code"] == "invalid_api_key"
        assert r.headers["WWW-Authenticate"] == "Bearer"
        assert KEY not in r.text
        checked += 1
    assert checked >= 18
    assert fake.runtime.forward_calls == 0  # nothing ran


def test_the_key_opens_every_route(keyed):
    fake, client, app = keyed
    fake.script.reply("Hello", ["Hi"])
    client.simulate_post("/v1/chat/completions", json=SESSION_TURN, headers={"X-Api-Key": KEY})
    for method, path in routes(app):
        for headers in ({"Authorization": f"Bearer {KEY}"}, {"X-Api-Key": KEY}):
            r = client.simulate_request(method, path, json=BODY, headers=headers)
            assert r.status_code != 401, (method, path, r.text)
            if method == "DELETE":  # deleted by the first header form; the second finds nothing
                client.simulate_post("/v1/chat/completions", json=SESSION_TURN,
                                     headers={"X-Api-Key": KEY})
    assert client.simulate_get("/health").status_code == 200  # open without the key


def test_options_without_the_key_says_nothing_and_runs_nothing(keyed):
    fake, client, app = keyed
    fake.script.reply("Hello", ["Hi"])
    client.simulate_post("/v1/chat/completions", json=SESSION_TURN, headers={"X-Api-Key": KEY})
    calls = fake.runtime.forward_calls
    for _, path in routes(app):
        r = client.simulate_options(path)
        assert r.status_code == 200 and r.content == b"", path  # a CORS preflight carries no key
        assert "allow" in r.headers
    assert fake.runtime.forward_calls == calls
    # the session is still there: OPTIONS on its route deleted nothing
    listing = client.simulate_get("/v1/sessions", headers={"X-Api-Key": KEY}).json
    assert [s["id"] for s in listing["data"]] == ["s1"]


def test_metrics_can_require_the_key():
    fake = FakeModel(settings={"ETSERVE_API_KEY": KEY, "ETSERVE_METRICS_AUTH": "key"})
    client = fake.client()
    assert client.simulate_get("/metrics").status_code == 401
    assert client.simulate_get("/metrics", headers={"X-Api-Key": KEY}).status_code == 200
    assert client.simulate_get("/").status_code == 200  # the chat page holds no data
