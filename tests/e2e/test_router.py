"""--models-dir: several models behind one server (llama.cpp's router mode), on real gunicorn with
the two real test models (SmolLM2 and Qwen) in a directory of their own."""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from e2e.servers import Server


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory, model_dir, qwen_dir):
    d = tmp_path_factory.mktemp("models")
    (d / "smollm2").symlink_to(model_dir)
    (d / "qwen").symlink_to(qwen_dir)
    (d / "notes").mkdir()  # no model.pte: not a model
    (d / "dangling").symlink_to(d / "gone")
    return d


@pytest.fixture(scope="module")
def router(models_dir):
    srv = Server(models_dir, {"ETSERVE_MODELS_DIR": str(models_dir), "ETSERVE_MODELS_MAX": "1",
                              "ETSERVE_QUEUE_TIMEOUT": "3", "ETSERVE_MODEL": "smollm2"})
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def statuses(srv) -> dict[str, str]:
    return {name: m["status"] for name, m in srv.health()["models"].items()}


def complete(srv, model, prompt="1, 2, 3, 4,", **extra):
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, **extra}
    if model is not None:
        body["model"] = model
    return requests.post(srv.base_url + "/v1/completions", json=body, timeout=120)


def test_the_list_offers_each_model_directory_unloaded_at_first(router):
    assert statuses(router) == {"qwen": "unloaded", "smollm2": "unloaded"}
    cards = requests.get(router.base_url + "/v1/models", timeout=5).json()["data"]
    assert [c["id"] for c in cards] == ["qwen", "smollm2"]
    by_id = {c["id"]: c for c in cards}
    assert by_id["smollm2"]["status"] == {"value": "unloaded"}
    assert by_id["smollm2"]["context_length"] == 512  # from its manifest, without loading it
    assert requests.get(router.base_url + "/models/qwen", timeout=5).json()["status"]["value"] == "unloaded"


def test_requests_load_what_they_name_and_the_oldest_gives_way(router, server):
    r = complete(router, "smollm2")
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "smollm2"
    # the router hands the body over as it came: the same answer as a server of SmolLM2 alone
    alone = complete(server, "smollm2").json()["choices"][0]["text"]
    assert r.json()["choices"][0]["text"] == alone
    assert statuses(router) == {"qwen": "unloaded", "smollm2": "loaded"}

    r = complete(router, "qwen")
    assert r.status_code == 200 and r.json()["model"] == "qwen", r.text
    assert statuses(router) == {"qwen": "loaded", "smollm2": "unloaded"}  # --models-max 1
    card = requests.get(router.base_url + "/v1/models/qwen", timeout=5).json()
    assert card["status"] == {"value": "loaded"} and card["context_length"] == 32768

    # no `model`: the loaded one (no swap for a client that names none)
    r = complete(router, None)
    assert r.status_code == 200 and r.json()["model"] == "qwen"


def test_a_streamed_chat_and_a_chunked_body_pass_through(router):
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 5,
            "stream": True}
    data = json.dumps(body).encode()
    # a generator body: requests sends it chunked (no Content-Length)
    r = requests.post(router.base_url + "/v1/chat/completions", data=iter([data[:10], data[10:]]),
                      headers={"Content-Type": "application/json"}, stream=True, timeout=120)
    assert r.status_code == 200, r.text
    lines = [ln for ln in r.iter_lines() if ln.startswith(b"data: ")]
    assert lines[-1] == b"data: [DONE]"
    assert json.loads(lines[0][6:])["model"] == "smollm2"


def test_unknown_models_and_bad_bodies_get_each_apis_error(router):
    r = complete(router, "nope")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and "qwen, smollm2" in err["message"]
    r = requests.post(router.base_url + "/v1/messages", timeout=10,
                      json={"model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "not_found_error"
    # a JSON body labelled as `curl -d` labels it names its model too (the model's app reads it as JSON)
    for label in ("application/x-www-form-urlencoded", "text/plain"):
        r = requests.post(router.base_url + "/v1/completions", timeout=10, headers={"Content-Type": label},
                          data=json.dumps({"model": "nope", "prompt": "hi", "max_tokens": 1}))
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    r = requests.post(router.base_url + "/v1/chat/completions", data=b'{"model":',
                      headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = requests.post(router.base_url + "/v1/chat/completions", data=b"x" * (5 << 20),
                      headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 413
    assert statuses(router)["qwen"] in ("loaded", "unloaded")  # still up, nothing broken


def no_eos(directory) -> dict[str, int]:
    """A logit_bias that keeps the model from ending its answer."""
    return {str(i): -100 for i in json.loads((directory / "etserve.json").read_text())["eos_token_ids"]}


def test_a_busy_model_keeps_its_place_until_its_request_ends(router, qwen_dir):
    assert complete(router, "qwen").status_code == 200
    # a long stream on Qwen (some 2,000 tokens: half a minute), left unread after its first event
    stream = requests.post(router.base_url + "/v1/completions", stream=True, timeout=120,
                           json={"model": "qwen", "prompt": "1, 2, 3,", "max_tokens": 2000,
                                 "stream": True, "logit_bias": no_eos(qwen_dir)})
    lines = stream.iter_lines()  # kept: a dropped iterator closes the connection
    assert next(lines).startswith(b"data: ")
    started = time.monotonic()
    r = complete(router, "smollm2")  # needs Qwen's room: waits --queue-timeout (3 s), then 503
    assert r.status_code == 503 and r.json()["error"]["code"] == "models_busy", r.text
    assert time.monotonic() - started >= 2.5
    assert statuses(router)["qwen"] == "loaded" and router.health()["models"]["qwen"]["busy"] == 1
    # meanwhile Qwen itself still serves
    assert complete(router, "qwen").status_code == 200
    stream.close()  # the client leaves: its decoding stops, the model is free
    deadline = time.monotonic() + 30
    while router.health()["models"]["qwen"]["busy"] and time.monotonic() < deadline:
        time.sleep(0.1)
    r = complete(router, "smollm2")
    assert r.status_code == 200, r.text
    assert statuses(router) == {"qwen": "unloaded", "smollm2": "loaded"}


def test_a_request_waiting_for_room_is_served_when_it_frees(router, qwen_dir):
    assert complete(router, "qwen").status_code == 200
    results = {}

    def long_qwen():
        results["qwen"] = complete(router, "qwen", max_tokens=20, logit_bias=no_eos(qwen_dir))

    t = threading.Thread(target=long_qwen)
    t.start()
    time.sleep(0.3)
    r = complete(router, "smollm2")  # waits for the Qwen request (20 tokens: well under 3 s), then swaps
    t.join()
    assert results["qwen"].status_code == 200 and r.status_code == 200, r.text
    assert r.json()["model"] == "smollm2"


def test_a_model_is_freed_only_once_its_last_step_has_ended(models_dir):
    """A stream's client leaves while its step runs in the native thread pool (each step held
    back 0.5 s by a test-only fault; keep-alive comments every 0.1 s, so the server sees the client
    gone mid-step). Its model is then needed for another: it is freed only once that step has
    ended. (Freed at the response's close, the step ran on a freed runtime: the worker died when
    the free came during the computation.)"""
    srv = Server(models_dir, {"ETSERVE_MODELS_DIR": str(models_dir), "ETSERVE_MODELS_MAX": "1",
                              "ETSERVE_MODEL": "qwen", "ETSERVE_FAULT_INJECT": "slow_forward:0.5",
                              "ETSERVE_SSE_KEEPALIVE": "0.1"})
    try:
        srv.wait_ready()
        assert complete(srv, "qwen", max_tokens=1).status_code == 200  # loaded: the stream's step is its prompt's
        stream = requests.post(srv.base_url + "/v1/completions", stream=True, timeout=120,
                               json={"model": "qwen", "prompt": "1, 2, 3,", "max_tokens": 50, "stream": True})
        assert stream.status_code == 200
        assert next(stream.iter_lines()) == b": keep-alive"  # its prompt's step under way
        stream.close()
        r = complete(srv, "smollm2", max_tokens=1)  # Qwen's room: Qwen goes, once its step has ended
        assert r.status_code == 200, r.text
        assert statuses(srv) == {"qwen": "unloaded", "smollm2": "loaded"}
        log = srv.log_path.read_text(errors="replace")
        # its step ran on a live runtime (after a free: "runtime error: no model", or a dead worker)
        assert log.count("Booting worker") == 1 and "Traceback" not in log and "ERROR" not in log, log[-3000:]
    finally:
        srv.stop()


def test_load_and_unload_routes(router):
    url = router.base_url
    r = requests.post(url + "/models/load", json={"model": "qwen"}, timeout=120)
    assert r.status_code == 200 and r.json()["success"] is True
    assert statuses(router) == {"qwen": "loaded", "smollm2": "unloaded"}
    r = requests.post(url + "/models/unload", json={"model": "qwen"}, timeout=30)
    assert r.status_code == 200
    assert statuses(router) == {"qwen": "unloaded", "smollm2": "unloaded"}
    assert requests.post(url + "/models/load", json={"model": "nope"}, timeout=10).status_code == 404
    assert requests.post(url + "/models/load", json={}, timeout=10).status_code == 400


def test_a_model_copied_in_later_is_offered_and_a_broken_one_fails_alone(router, models_dir, broken_model_dir):
    (models_dir / "broken").symlink_to(broken_model_dir)
    try:
        assert statuses(router)["broken"] == "unloaded"
        r = complete(router, "broken")
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_failed"
        assert str(broken_model_dir) not in r.text  # no paths to the client
        assert "model.pte" in r.json()["error"]["message"], r.text  # the cause, by the file's name
        assert statuses(router)["broken"] == "failed"
        assert complete(router, "smollm2").status_code == 200
        # asked again, the same broken files are not tried again at the cost of the loaded model
        r = complete(router, "broken")
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_failed"
        assert statuses(router)["smollm2"] == "loaded"
    finally:
        (models_dir / "broken").unlink()
    assert "broken" not in statuses(router)


def test_an_unauthenticated_request_loads_nothing(models_dir):
    srv = Server(models_dir, {"ETSERVE_MODELS_DIR": str(models_dir), "ETSERVE_API_KEY": "k1"})
    try:
        srv.wait_ready()
        r = complete(srv, "smollm2")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert requests.get(srv.base_url + "/v1/models", timeout=5).status_code == 401
        # open, as on a server of one model: the chat page (it asks for the key) and, by
        # default (--metrics-auth open), /metrics
        assert requests.get(srv.base_url + "/", timeout=5).status_code == 200
        assert requests.get(srv.base_url + "/metrics", timeout=5).status_code == 200
        assert statuses(srv) == {"qwen": "unloaded", "smollm2": "unloaded"}
        r = requests.post(srv.base_url + "/v1/completions", headers={"Authorization": "Bearer k1"}, timeout=120,
                          json={"model": "smollm2", "prompt": "1, 2,", "max_tokens": 3})
        assert r.status_code == 200 and statuses(srv)["smollm2"] == "loaded"
    finally:
        srv.stop()


def test_a_preflight_and_a_refused_web_page_load_nothing(models_dir):
    """Browser pages (CORS) on a router: a preflight and a page of an origin not allowed are answered
    by the router itself; an allowed page's request loads its model and its answer is readable."""
    srv = Server(models_dir, {"ETSERVE_MODELS_DIR": str(models_dir)})
    try:
        srv.wait_ready()
        pre = requests.options(srv.base_url + "/v1/completions", timeout=5, headers={
            "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})
        assert pre.status_code == 204 and pre.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
        r = requests.post(srv.base_url + "/v1/completions", timeout=10, headers={
            "Origin": "https://evil.example", "Content-Type": "text/plain"},
            data=json.dumps({"model": "smollm2", "prompt": "1, 2,", "max_tokens": 3}))
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
        assert statuses(srv) == {"qwen": "unloaded", "smollm2": "unloaded"}
        r = requests.post(srv.base_url + "/v1/completions", timeout=120, headers={"Origin": "http://localhost:3000"},
                          json={"model": "smollm2", "prompt": "1, 2,", "max_tokens": 3})
        assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
        assert statuses(srv)["smollm2"] == "loaded"
    finally:
        srv.stop()


def test_a_single_model_server_answers_the_router_routes(server):
    """llama.cpp's router routes on a server of one model: it is always loaded."""
    model_id = requests.get(server.base_url + "/v1/models", timeout=5).json()["data"][0]["id"]
    r = requests.post(server.base_url + "/models/load", json={"model": model_id}, timeout=10)
    assert r.status_code == 200 and r.json() == {"success": True, "model": model_id, "status": "loaded"}
    r = requests.post(server.base_url + "/models/load", json={"model": "nope"}, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = requests.post(server.base_url + "/models/unload", json={"model": model_id}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "unload_unsupported"
    assert "--models-dir" in r.json()["error"]["message"]


def test_a_models_directory_with_no_model_fails_the_health_check(tmp_path, model_dir):
    """Every request would be a 503 no_models: /health says so (503), for GET and HEAD, so a load
    balancer or systemd's check does not take the server for ready; a model copied in heals it."""
    srv = Server(tmp_path, {"ETSERVE_MODELS_DIR": str(tmp_path / "models")})
    try:
        srv.wait_ready(status="no_models")
        r = requests.get(srv.base_url + "/health", timeout=5)
        assert r.status_code == 503 and r.json()["status"] == "no_models", r.text
        assert requests.head(srv.base_url + "/health", timeout=5).status_code == 503
        assert requests.post(srv.base_url + "/v1/completions", json={"prompt": "x"}, timeout=5).status_code == 503
        (tmp_path / "models").mkdir()
        (tmp_path / "models" / "notes").mkdir()
        assert requests.get(srv.base_url + "/health", timeout=5).status_code == 503
        (tmp_path / "models" / "smollm2").symlink_to(model_dir)
        r = requests.get(srv.base_url + "/health", timeout=5)
        assert r.status_code == 200 and r.json()["models"] == {"smollm2": {"status": "unloaded", "busy": 0}}, r.text
    finally:
        srv.stop()


def test_metrics_gather_the_loaded_models_and_load_none(router):
    """/metrics of a router: each loaded model's series with a `model` label and every model's
    status; a scrape loads nothing (an idle router stays idle)."""
    before = statuses(router)
    text = requests.get(router.base_url + "/metrics", timeout=10).text
    assert statuses(router) == before
    for name, status in before.items():
        assert f'etserve_model_status{{model="{name}",status="{status}"}} 1.0' in text
    assert complete(router, "smollm2").status_code == 200
    text = requests.get(router.base_url + "/metrics", timeout=10).text
    assert 'etserve_generations_total{model="smollm2"}' in text
    assert 'model="qwen"' not in text.replace('etserve_model_status{model="qwen"', "")  # not loaded: no series
