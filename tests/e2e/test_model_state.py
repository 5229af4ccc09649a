"""The model's life cycle on /health: a server whose model cannot load stays up and says why."""

from __future__ import annotations


import requests


def test_a_model_that_fails_to_load_is_reported_not_fatal(broken_model_dir, make_server):
    srv = make_server({"ETSERVE_MODEL_PATH": str(broken_model_dir)}, status="failed")
    health = requests.get(srv.base_url + "/health", timeout=5)
    assert health.status_code == 503
    assert health.json()["status"] == "failed" and str(broken_model_dir) not in health.text
    assert "cannot load" in srv.log_path.read_text()  # the cause is logged
    r = requests.post(srv.base_url + "/v1/chat/completions", timeout=10,
                      json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "model_failed" and r.headers["Retry-After"]
