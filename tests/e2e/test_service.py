"""etserve as a service: the console script, configuration by environment only, the deploy
files that list the settings, the systemd unit, and the one log line per request."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from app.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
ETSERVE = Path(sys.executable).parent / "etserve"  # the console script setup.cfg installs


def test_help_lists_every_setting():
    out = subprocess.run([str(ETSERVE), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for s in SETTINGS:
        assert s.flag in out.stdout and s.env in out.stdout, f"{s.flag} / {s.env} missing from etserve --help"


def test_env_example_lists_every_setting():
    text = (ROOT / "deploy" / "etserve.env.example").read_text()
    listed = dict(re.findall(r"^#?(ETSERVE_[A-Z0-9_]+)=(.*)$", text, re.M))
    for s in SETTINGS:
        assert s.env in listed, (f"{s.env} is missing from deploy/etserve.env.example: run "
                                 "`.venv/bin/python deploy/gen_env_example.py > deploy/etserve.env.example`")
        assert listed[s.env] == s.default, f"{s.env}: the example's default {listed[s.env]!r} is not {s.default!r}"
    # and it names nothing the code does not read
    code = "\n".join(p.read_text() for p in [*(ROOT / "app").rglob("*.py"), *(ROOT / "native" / "src").glob("*.cpp")])
    for env in listed:
        assert env in code, f"deploy/etserve.env.example lists {env}, which nothing reads"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_unit_verifies(tmp_path):
    """The unit as shipped, pointed at this checkout and this user (verify checks both exist)."""
    import pwd

    user = pwd.getpwuid(os.getuid()).pw_name
    unit = (ROOT / "deploy" / "etserve.service").read_text()
    for old, new in {"/opt/etserve/.venv/bin/etserve": str(ETSERVE), "WorkingDirectory=/opt/etserve":
                     f"WorkingDirectory={ROOT}", "User=etserve": f"User={user}", "Group=etserve": ""}.items():
        assert old in unit
        unit = unit.replace(old, new)
    path = tmp_path / "etserve.service"
    path.write_text(unit)
    out = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    # unknown keys and bad values are only warnings (exit status 0): any output is a failure
    problems = [line for line in (out.stdout + out.stderr).splitlines()
                if line.strip() and "etserve.service" in line]
    assert out.returncode == 0 and not problems, out.stdout + out.stderr
    for line in ("EnvironmentFile=/etc/etserve.env", "Restart=on-failure", "KillSignal=SIGTERM",
                 "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes"):
        assert re.search(rf"^{re.escape(line)}$", unit, re.M), f"the unit lost {line}"
    # the stop timeout outlasts gunicorn's graceful shutdown
    graceful = int(re.search(r"^graceful_timeout = (\d+)", (ROOT / "app" / "gunicorn_conf.py").read_text(),
                             re.M).group(1))
    assert int(re.search(r"^TimeoutStopSec=(\d+)", unit, re.M).group(1)) > graceful


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def env_only_server(model_dir, tmp_path_factory):
    """`etserve` with no flags, from an unrelated directory, configured only by ETSERVE_*."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETSERVE_")}
    env.update({"ETSERVE_MODEL_PATH": str(model_dir), "ETSERVE_PORT": str(port), "ETSERVE_HOST": "127.0.0.1",
                "ETSERVE_THREADS": "2", "ETSERVE_MODEL_ID": "from-the-environment", "ETSERVE_API_KEY": "s3cret"})
    log_path = ROOT / "test-artifacts" / f"service-{port}.log"
    log_path.parent.mkdir(exist_ok=True)
    log = open(log_path, "wb")
    proc = subprocess.Popen([str(ETSERVE)], cwd=tmp_path_factory.mktemp("elsewhere"), env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log_path.read_text()[-4000:]
            try:
                if requests.get(base + "/health", timeout=1).json().get("status") == "ok":
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, log_path.read_text()[-4000:]
            time.sleep(0.2)
        yield base, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _log_line(path: Path, rid: str, timeout: float = 5) -> str:
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for line in path.read_text(errors="replace").splitlines() if f"rid={rid}" in line]
        if lines:
            assert len(lines) == 1, lines
            return lines[0]
        assert time.monotonic() < deadline, f"no log line for {rid}"
        time.sleep(0.05)


def test_env_only_configuration(env_only_server):
    base, _ = env_only_server
    key = {"Authorization": "Bearer s3cret"}
    assert requests.get(base + "/health", timeout=5).status_code == 200
    assert requests.get(base + "/v1/models", timeout=5).status_code == 401
    assert requests.get(base + "/v1/models", headers=key, timeout=5).json()["data"][0]["id"] == "from-the-environment"
    r = requests.post(base + "/v1/chat/completions", headers=key, timeout=60, json={
        "model": "from-the-environment", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]


def test_one_log_line_per_request_with_tokens_and_timings(env_only_server):
    base, log_path = env_only_server
    key = {"Authorization": "Bearer s3cret"}
    body = {"messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 6, "temperature": 0}
    r = requests.post(base + "/v1/chat/completions", json=body, timeout=60,
                      headers={**key, "X-Request-Id": "log-plain"})
    usage = r.json()["usage"]
    line = _log_line(log_path, "log-plain")
    assert '"POST /v1/chat/completions HTTP/1.1" 200 ' in line
    assert (f"prompt={usage['prompt_tokens']} cached={usage['prompt_tokens_details']['cached_tokens']} "
            f"completion={usage['completion_tokens']} finish=length ") in line
    assert re.search(r" queued=\d+ms prefill=\d+ms decode=\d+ms$", line), line
    text = r.json()["choices"][0]["message"]["content"]
    r = requests.post(base + "/v1/chat/completions", timeout=60, headers={**key, "X-Request-Id": "log-stopped"},
                      json={**body, "stop": [text[len(text) // 2:][:2]]})  # a stop string ends it
    assert r.json()["choices"][0]["finish_reason"] == "stop", r.text
    assert " finish=stop " in _log_line(log_path, "log-stopped")

    with requests.post(base + "/v1/chat/completions", stream=True, timeout=60,
                       headers={**key, "X-Request-Id": "log-stream"},
                       json={**body, "stream": True, "stream_options": {"include_usage": True}}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith(b"data: {")]
    usage = events[-1]["usage"]
    line = _log_line(log_path, "log-stream")
    assert f"completion={usage['completion_tokens']} finish=length " in line

    # requests that generate nothing get their line too, without token counts
    requests.get(base + "/health", headers={"X-Request-Id": "log-health"}, timeout=5)
    assert _log_line(log_path, "log-health").endswith(" -")
    r = requests.post(base + "/v1/chat/completions", json=body, timeout=60, headers={"X-Request-Id": "log-401"})
    assert r.status_code == 401
    line = _log_line(log_path, "log-401")
    assert '" 401 ' in line and re.search(r" error=\w+$", line), line
    # an error's line ends with its code, the one the client's body shows
    r = requests.post(base + "/v1/chat/completions", json={**body, "max_tokens": -2}, timeout=60,
                      headers={**key, "X-Request-Id": "log-400"})
    assert r.status_code == 400, r.text
    line = _log_line(log_path, "log-400")
    assert '" 400 ' in line and line.endswith(f" error={r.json()['error']['code']}"), (line, r.text)
