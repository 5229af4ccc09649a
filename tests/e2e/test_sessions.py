"""Sessions over HTTP on the real server: session_id in the body or a header, the
turn after another conversation reports its previous turn as cached, the
listing, DELETE, and the 400s for bad ids."""

from __future__ import annotations

import uuid

import pytest
import requests

from .test_errors import assert_envelope


def chat(server, messages, session_id=None, headers=None, max_tokens=8, **extra):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
    if session_id is not None:
        body["session_id"] = session_id
    r = requests.post(server.base_url + "/v1/chat/completions", json=body, headers=headers or {}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def sessions(server) -> dict:
    r = requests.get(server.base_url + "/v1/sessions", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def live_session(server) -> str | None:
    live = [s["id"] for s in sessions(server)["data"] if s["live"]]
    return live[0] if live else None


def sid(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_turn_two_after_another_session_reports_turn_one_as_cached(server):
    a, b = sid("a"), sid("b")
    m1 = [{"role": "user", "content": "Tell me one fact about the Moon."}]
    r1 = chat(server, m1, a)
    chat(server, [{"role": "user", "content": "What is two plus two? Answer with a long story."}], b)
    m2 = m1 + [r1["choices"][0]["message"], {"role": "user", "content": "And one about Mars?"}]
    r2 = chat(server, m2, a)
    turn1 = r1["usage"]["prompt_tokens"] + r1["usage"]["completion_tokens"]
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert r1["usage"]["prompt_tokens"] <= cached <= r2["usage"]["prompt_tokens"] - 1
    assert cached >= turn1 - 3  # all of turn 1 but the last generated token(s)
    assert r2["timings"]["cache_n"] == cached

    listing = sessions(server)
    entries = {s["id"]: s for s in listing["data"]}
    assert listing["enabled"] is True and listing["max_bytes"] == 512 * 2**20
    # each conversation kept its own sequence slot: b's state was never copied aside
    assert entries[b]["tokens"] > 0 and entries[b]["live"] and entries[a]["live"]
    assert entries[a]["slot"] != entries[b]["slot"] and entries[a]["object"] == "session"
    # most recent first, with the tokens its slot holds now (turn 2's prompt and answer)
    assert [s["id"] for s in listing["data"] if s["id"] in (a, b)] == [a, b]
    assert entries[a]["tokens"] >= r2["usage"]["prompt_tokens"]
    assert listing["used_bytes"] == sum(s["bytes"] for s in listing["data"])


def test_completions_take_a_session_id_too(server):
    a, b = sid("ca"), sid("cb")
    prompt = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "session_id": a}
    r1 = requests.post(server.base_url + "/v1/completions", json=body, timeout=120).json()
    requests.post(server.base_url + "/v1/completions",
                  json={"prompt": "Zebras are", "max_tokens": 4, "session_id": b}, timeout=120).raise_for_status()
    body["prompt"] = prompt + r1["choices"][0]["text"] + " And then"
    r2 = requests.post(server.base_url + "/v1/completions", json=body, timeout=120).json()
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] >= r1["usage"]["prompt_tokens"]


@pytest.mark.parametrize("header", ["X-Session-ID", "X-ExecuTorch-Session-ID", "x-session-affinity"])
def test_the_session_headers(server, header):
    s = sid("h")
    chat(server, [{"role": "user", "content": "Hi"}], headers={header: s}, max_tokens=2)
    assert live_session(server) == s


def test_the_body_wins_over_the_headers(server):
    body_id, header_id = sid("body"), sid("hdr")
    chat(server, [{"role": "user", "content": "Hi"}], body_id, headers={"X-Session-ID": header_id}, max_tokens=2)
    assert live_session(server) == body_id
    assert header_id not in {s["id"] for s in sessions(server)["data"]}


def test_delete_a_session(server):
    s = sid("del")
    chat(server, [{"role": "user", "content": "Say hello."}], s, max_tokens=3)
    chat(server, [{"role": "user", "content": "Say goodbye."}], sid("other"), max_tokens=3)  # s gets saved
    assert s in {e["id"] for e in sessions(server)["data"]}
    r = requests.delete(f"{server.base_url}/v1/sessions/{s}", timeout=10)
    assert r.status_code == 200 and r.json() == {"id": s, "object": "session", "deleted": True}
    assert s not in {e["id"] for e in sessions(server)["data"]}
    err = assert_envelope(requests.delete(f"{server.base_url}/v1/sessions/{s}", timeout=10), 404, "session_id")
    assert err["code"] == "session_not_found" and err["type"] == "not_found_error"
    # without /v1 as well
    t = sid("del2")
    chat(server, [{"role": "user", "content": "Hi"}], t, max_tokens=2)
    assert requests.delete(f"{server.base_url}/sessions/{t}", timeout=10).json()["deleted"] is True
    assert_envelope(requests.delete(f"{server.base_url}/sessions/{t}", timeout=10), 404, "session_id")


@pytest.mark.parametrize("value", [123, "", "x" * 129, ["a"], True])
def test_invalid_session_ids_are_400(server, value):
    for route, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                        ("/v1/completions", {"prompt": "Hi"})):
        r = requests.post(server.base_url + route, json={**body, "session_id": value}, timeout=30)
        err = assert_envelope(r, 400, "session_id")
        assert "session_id" in err["message"]


def test_invalid_session_header_is_400(server):
    r = requests.post(server.base_url + "/v1/chat/completions", timeout=30,
                      json={"messages": [{"role": "user", "content": "Hi"}]},
                      headers={"X-ExecuTorch-Session-ID": "y" * 129})
    assert_envelope(r, 400, "X-ExecuTorch-Session-ID")
    assert_envelope(requests.delete(f"{server.base_url}/v1/sessions/{'z' * 129}", timeout=10), 400, "session_id")


def test_a_session_dir_that_cannot_be_used_does_not_stop_the_server(make_server, tmp_path):
    """--session-dir names a file, or a directory full of poison: the server starts and serves."""
    import os

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("not a directory")
    poisoned = tmp_path / "poisoned"
    poisoned.mkdir()
    (poisoned / "deep.kv").write_bytes(b"ETSKV\x01\r\n" + (20000).to_bytes(4, "little") + b"[" * 20000)
    (poisoned / "dir.kv").mkdir()
    os.mkfifo(poisoned / "fifo.kv")
    for directory in (not_a_dir, poisoned):
        srv = make_server({"ETSERVE_SESSION_DIR": str(directory)})
        r = requests.post(srv.base_url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "session_id": "s"})
        assert r.status_code == 200, r.text
        srv.stop()
    written = [p for p in poisoned.glob("*.kv") if p.is_file() and p.name != "deep.kv"]
    assert written and all(p.stat().st_mode & 0o777 == 0o600 for p in written)  # the state it saved: private
