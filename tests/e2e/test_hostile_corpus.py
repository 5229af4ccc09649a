"""The hostile corpus (tests/hostile/corpus.py) against a real server on a real socket: every case
gets the status it states, in its API's error envelope, and the worker that answered is alive and
the same process after each (a case that killed it would show as a new worker pid)."""

from __future__ import annotations

import pytest
import requests

from hostile.corpus import CASES, Case
from hostile.workers import worker_pids


def _send(server, case: Case) -> requests.Response:
    headers = {"Content-Type": case.content_type} if case.body is not None else {}
    return requests.request(case.method, server.base_url + case.path, data=case.body, headers=headers, timeout=60)


@pytest.fixture(scope="module")
def workers(server):
    return worker_pids(server.proc.pid)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_case_gets_its_status(server, workers, case):
    r = _send(server, case)
    assert r.status_code < 500, (r.status_code, r.text[:300])
    assert r.status_code == case.status, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        body = r.json()
        if case.path.startswith("/v1/messages"):  # Anthropic's envelope
            assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        else:
            assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert "Traceback" not in r.text and ".py" not in r.text
    assert worker_pids(server.proc.pid) == workers, "the worker died or was replaced"
    assert requests.get(server.base_url + "/health", timeout=10).json()["status"] == "ok"


def test_corpus_covers_every_route():
    paths = {c.path.split("/resp_")[0].split("/sessions/")[0] for c in CASES}
    for route in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                  "/v1/messages/count_tokens", "/infill", "/tokenize", "/detokenize", "/apply-template"):
        assert route in paths, route
    assert len(CASES) >= 40
