"""Two API keys are two clients: neither sees, continues nor deletes the other's stored responses,
and /v1/sessions lists only the caller's sessions (README: What clients of one box share)."""

from __future__ import annotations

import pytest
import requests

A, B = "key-alice", "key-bob"


@pytest.fixture(scope="module")
def keyed(make_server):
    return make_server({"ETSERVE_API_KEY": f"{A}, {B}", "ETSERVE_MAX_TOKENS_CAP": "2"})


def _h(key):
    return {"Authorization": f"Bearer {key}"}


def test_each_key_is_a_client(keyed):
    url = keyed.base_url
    r = requests.post(url + "/v1/responses", headers=_h(A), json={"input": "hi", "max_output_tokens": 2}, timeout=120)
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    assert requests.get(f"{url}/v1/responses/{rid}", headers=_h(A), timeout=10).status_code == 200
    # Bob: as if it did not exist
    assert requests.get(f"{url}/v1/responses/{rid}", headers=_h(B), timeout=10).status_code == 404
    assert requests.delete(f"{url}/v1/responses/{rid}", headers=_h(B), timeout=10).status_code == 404
    r = requests.post(url + "/v1/responses", headers=_h(B), timeout=120,
                      json={"input": "and?", "previous_response_id": rid, "max_output_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found", r.text  # OpenAI's
    # Alice's conversation goes on
    r = requests.post(url + "/v1/responses", headers=_h(A), timeout=120,
                      json={"input": "and?", "previous_response_id": rid, "max_output_tokens": 2})
    assert r.status_code == 200, r.text
    assert requests.post(url + "/v1/responses", json={"input": "x"}, timeout=10).status_code == 401


def test_sessions_list_only_the_callers(keyed):
    url = keyed.base_url
    for key, sid in ((A, "alice-session"), (B, "bob-session")):
        r = requests.post(url + "/v1/chat/completions", headers=_h(key), timeout=120,
                          json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "session_id": sid})
        assert r.status_code == 200, r.text
    r = requests.post(url + "/v1/responses", headers=_h(B), json={"input": "hi", "max_output_tokens": 2}, timeout=120)
    bob_response = r.json()["id"]
    mine = {e["id"] for e in requests.get(url + "/v1/sessions", headers=_h(A), timeout=10).json()["data"]}
    theirs = {e["id"] for e in requests.get(url + "/v1/sessions", headers=_h(B), timeout=10).json()["data"]}
    assert "alice-session" in mine and "bob-session" not in mine and bob_response not in mine
    assert "bob-session" in theirs and bob_response in theirs and "alice-session" not in theirs
    assert not any("~" in s for s in mine | theirs)  # the engine's scoped ids are not shown
    # Bob cannot drop Alice's session, by its name or by the engine's
    assert requests.delete(url + "/v1/sessions/alice-session", headers=_h(B), timeout=10).status_code == 404
    assert requests.delete(url + "/v1/sessions/alice-session", headers=_h(A), timeout=10).status_code == 200
