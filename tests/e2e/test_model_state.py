"""The model's life cycle on /health: a server whose model cannot load stays up and says why."""

from __future__ import annotations

import shutil

import requests


def test_a_model_that_fails_to_load_is_reported_not_fatal(tmp_path, model_dir, make_server):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir / name, broken / name)
    (broken / "model.pte").write_bytes(b"this is not an ExecuTorch program" * 64)
    srv = make_server({"ETSERVE_MODEL_PATH": str(broken)}, status="failed")
    health = requests.get(srv.base_url + "/health", timeout=5)
    assert health.status_code == 503
    assert health.json()["status"] == "failed" and str(broken) not in health.text
    assert "cannot load" in srv.log_path.read_text()  # the cause is logged
    r = requests.post(srv.base_url + "/v1/chat/completions", timeout=10,
                      json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "model_failed" and r.headers["Retry-After"]
