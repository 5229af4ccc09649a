"""`etserve --model FILE.gguf` from the command line, as the README shows it: the file is built
(with `--quantize` when given) into the cache and served by a real gunicorn on a real socket;
`--quantize` picks the build a named model serves, and a value that is not a build option stops
the command with one line before anything is built."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from e2e.servers import free_port
from models.tiny_gguf import write_tiny

ROOT = Path(__file__).resolve().parents[2]


def _env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ETSERVE_MODEL", "ETSERVE_QUANTIZE"))}
    env.update(ETSERVE_CACHE=str(cache), HF_HUB_OFFLINE="1")
    return env


def _etserve(*args: str, cache: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "app", *args], cwd=ROOT, env=_env(cache),
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_health(proc: subprocess.Popen, base: str, log: Path, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"etserve exited with {proc.returncode}: {log.read_text()[-4000:]}")
        try:
            health = requests.get(base + "/health", timeout=1).json()
            if health.get("status") in ("ok", "failed"):
                return health
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise AssertionError(f"not ready in {timeout}s: {log.read_text()[-4000:]}")


@pytest.mark.slow
def test_a_gguf_is_built_with_the_quantization_asked_for_and_served_by_etserve_and_plain_gunicorn(tmp_path):
    gguf = write_tiny(tmp_path / "tiny-qwen2.gguf", "qwen2", qkv_bias=True, name="Tiny Served")
    cache, log, port = tmp_path / "cache", tmp_path / "etserve.log", free_port()
    proc = _etserve("--model", str(gguf), "--quantize", "8da8w", "--host", "127.0.0.1", "--port", str(port),
                    "--threads", "2", cache=cache, log=log)
    base = f"http://127.0.0.1:{port}"
    try:
        health = _wait_health(proc, base, log, timeout=900)
        assert health["status"] == "ok", health
        # one build, the one asked for (a file this small builds unquantized by default)
        manifests = [json.loads(p.read_text()) for p in (cache / "models").rglob("etserve.json")]
        assert [(m["quantize"], m["output_quantize"]) for m in manifests] == [("8da8w", "same")]
        (card,) = requests.get(base + "/v1/models", timeout=5).json()["data"]
        assert card["id"] == manifests[0]["name"]
        r = requests.post(base + "/v1/completions", timeout=60,
                          json={"prompt": "hello world", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
        assert 1 <= r.json()["usage"]["completion_tokens"] <= 4
        assert "ignored" not in log.read_text()  # the build's own quantization: nothing to warn about
    finally:
        _stop(proc)

    # The same file named by the environment alone, under gunicorn's own command line (a deployment
    # configured that way): its config finds the build (the same checksum and options, so no
    # second export) before the worker starts, as `etserve` does.
    log, port = tmp_path / "gunicorn.log", free_port()
    env = {**_env(cache), "ETSERVE_MODEL": str(gguf), "ETSERVE_QUANTIZE": "8da8w", "ETSERVE_PORT": str(port),
           "ETSERVE_HOST": "127.0.0.1", "ETSERVE_THREADS": "2", "ETSERVE_PARALLEL": "2"}
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py")], cwd=ROOT,
                            env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        assert _wait_health(proc, base, log, timeout=600)["status"] == "ok", log.read_text()[-3000:]
        assert len(list((cache / "models").rglob("etserve.json"))) == 1
        assert "ignored" not in log.read_text()
        head = requests.head(base + "/health", timeout=5)  # load balancers' checks
        assert head.status_code == 200 and head.content == b""
        assert requests.get(base + "/props", timeout=5).json()["total_slots"] == 2
        r = requests.post(base + "/completion", json={"prompt": "hello", "n_predict": 2}, timeout=60)
        assert r.status_code == 200 and 0 <= r.json()["id_slot"] < 2, r.text
    finally:
        _stop(proc)


def test_a_named_model_serves_the_build_quantize_names(tmp_path):
    """No build of that quantization in the cache: the server starts, says it has no model, and
    its message is the command that builds the one asked for."""
    cache, log, port = tmp_path / "cache", tmp_path / "etserve.log", free_port()
    proc = _etserve("--model", "smollm2-135m", "--quantize", "8da8w", "--host", "127.0.0.1", "--port", str(port),
                    cache=cache, log=log)
    try:
        health = _wait_health(proc, f"http://127.0.0.1:{port}", log, timeout=120)
        assert health["status"] == "failed", health
        text = log.read_text()
        assert str(cache / "models" / "smollm2-135m") in text and "-8da8w-" in text
        assert "python -m app.models build smollm2-135m --quantize 8da8w" in text
    finally:
        _stop(proc)


def test_a_quantize_that_is_no_build_option_stops_the_command(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "app", "--model", str(tmp_path / "x.gguf"), "--quantize", "q4_k_m"],
                          cwd=ROOT, env=_env(tmp_path / "cache"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == \
        "etserve: error: --quantize must be one of none, 8da4w, 8da8w, got 'q4_k_m'"
    assert not (tmp_path / "cache").exists()



def test_a_file_that_is_no_gguf_stops_etserve_in_one_line(tmp_path):
    """The build runs in gunicorn's config, before any worker: its one-line refusal is etserve's."""
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model at all" * 10)
    proc = subprocess.run([sys.executable, "-m", "app", "--model", str(bogus), "--port", str(free_port())], cwd=ROOT,
                          env=_env(tmp_path / "cache"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "build-gguf: bogus.gguf is not a GGUF file"
    assert "Traceback" not in proc.stderr and "Booting worker" not in proc.stderr
