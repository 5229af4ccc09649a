"""Browser pages on other origins (CORS): who may call, preflights, the headers on answers, the
403 for the rest (app/http/cors.py), over the real app and a scripted model. A real browser
against a real server: tests/e2e/test_chat_page.py's cross-origin case."""

from __future__ import annotations

import falcon.testing
import pytest

from app.http.cors import Cors, same_origin
from fakes.scripted import FakeModel

CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}
MESSAGES = {"model": "x", "max_tokens": 2, "messages": [{"role": "user", "content": "Hello"}]}


@pytest.fixture(scope="module")
def app_of():
    fakes = []

    def make(**settings):
        fake = FakeModel(settings=settings)
        fakes.append(fake)
        return falcon.testing.TestClient(fake.app())

    yield make
    for f in fakes:
        f.close()


def preflight(client, path, origin, headers="authorization, content-type"):
    return client.simulate_options(path, headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                  "Access-Control-Request-Headers": headers})


@pytest.mark.parametrize("origin", ["http://localhost:3000", "http://127.0.0.1:8080", "https://localhost",
                                    "http://[::1]:5173", "app://obsidian.md", "vscode-webview://abc123"])
def test_pages_on_this_machine_and_apps_may_call(app_of, origin):
    client = app_of()
    pre = preflight(client, "/v1/chat/completions", origin)
    assert pre.status_code == 204
    assert pre.headers["Access-Control-Allow-Origin"] == origin
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    assert pre.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    r = client.simulate_post("/v1/chat/completions", json=CHAT, headers={"Origin": origin})
    assert r.status_code == 200 and r.json["choices"]
    assert r.headers["Access-Control-Allow-Origin"] == origin
    assert "X-Request-Id" in r.headers["Access-Control-Expose-Headers"]
    assert "Origin" in r.headers["Vary"]


@pytest.mark.parametrize("origin", ["https://evil.example", "http://localhost.evil.example", "null",
                                    "http://127.0.0.1.nip.io:8000"])
def test_other_pages_are_refused_before_anything_runs(app_of, origin):
    client = app_of()
    pre = preflight(client, "/v1/chat/completions", origin)
    assert pre.status_code == 403 and "Access-Control-Allow-Origin" not in pre.headers
    # a text/plain POST needs no preflight: refused all the same, with no generation
    r = client.simulate_post("/v1/chat/completions", body='{"messages": [{"role": "user", "content": "hi"}]}',
                             headers={"Origin": origin, "Content-Type": "text/plain"})
    assert r.status_code == 403 and r.json["error"]["code"] == "origin_not_allowed"
    assert "--cors-origins" in r.json["error"]["message"]
    m = client.simulate_post("/v1/messages", json=MESSAGES, headers={"Origin": origin})
    assert m.status_code == 403 and m.json["type"] == "error" and m.json["error"]["type"] == "permission_error"


def test_no_origin_no_cors(app_of):
    """Clients that are not browsers (SDKs, curl, editors' extension hosts) send no Origin."""
    r = app_of().simulate_post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers


def test_the_servers_own_page_may_call_it(app_of):
    client = app_of()
    r = client.simulate_post("/v1/chat/completions", json=CHAT,
                             headers={"Origin": "http://box.lan:8000", "Host": "box.lan:8000"})
    assert r.status_code == 200
    # behind nginx: Host is nginx's $host (no port), or X-Forwarded-Host
    assert client.simulate_post("/v1/chat/completions", json=CHAT,
                                headers={"Origin": "https://box.lan:8443", "Host": "box.lan"}).status_code == 200
    assert client.simulate_post("/v1/chat/completions", json=CHAT,
                                headers={"Origin": "https://box.lan", "Host": "127.0.0.1:8000",
                                         "X-Forwarded-Host": "box.lan"}).status_code == 200
    assert client.simulate_post("/v1/chat/completions", json=CHAT,
                                headers={"Origin": "http://box.lan:9999", "Host": "box.lan:8000"}).status_code == 403


def test_cors_origins_adds_patterns_and_star_opens_all(app_of):
    client = app_of(ETSERVE_CORS_ORIGINS="https://chat.example.org, http://*.lan:3000")
    for origin, status in (("https://chat.example.org", 200), ("http://nas.lan:3000", 200),
                           ("http://nas.lan:3001", 403), ("https://evil.example", 403)):
        assert client.simulate_post("/v1/chat/completions", json=CHAT, headers={"Origin": origin}).status_code == status
    anyone = app_of(ETSERVE_CORS_ORIGINS="*")
    r = anyone.simulate_post("/v1/chat/completions", json=CHAT, headers={"Origin": "https://evil.example"})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "https://evil.example"


def test_with_an_api_key_any_page_may_ask_and_the_key_decides(app_of):
    client = app_of(ETSERVE_API_KEY="k1")
    origin = "https://chat.example.org"
    pre = preflight(client, "/v1/chat/completions", origin)
    assert pre.status_code == 204 and pre.headers["Access-Control-Allow-Origin"] == origin  # no key in a preflight
    no_key = client.simulate_post("/v1/chat/completions", json=CHAT, headers={"Origin": origin})
    assert no_key.status_code == 401 and no_key.headers["Access-Control-Allow-Origin"] == origin  # readable 401
    ok = client.simulate_post("/v1/chat/completions", json=CHAT, headers={"Origin": origin, "Authorization": "Bearer k1"})
    assert ok.status_code == 200 and ok.headers["Access-Control-Allow-Origin"] == origin


def test_a_stream_carries_the_headers(app_of):
    r = app_of().simulate_post("/v1/chat/completions", json={**CHAT, "stream": True},
                               headers={"Origin": "http://localhost:3000"})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
    assert "data: [DONE]" in r.text


def test_same_origin_rules():
    assert same_origin("http://box:8000", "box:8000")
    assert same_origin("http://box", "box:80") and same_origin("https://box", "box:443")
    assert not same_origin("http://box:8001", "box:8000")
    assert not same_origin("http://other:8000", "box:8000")
    assert not same_origin("http://box:8000", None) and not same_origin("http://box:x", "box")
    assert Cors("").allows("HTTP://LOCALHOST:3000", None)
