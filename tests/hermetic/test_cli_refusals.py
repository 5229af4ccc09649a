"""`etserve` refuses what it can before anything starts: one line naming the flag, exit 2 (a port
in use: exit 1), never gunicorn's traceback or a server that answers 503 to everything. The same
values under plain gunicorn stop its config with the same line (app/gunicorn_conf.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ETSERVE_")}


def _etserve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("args, says", [
    (["--model", "foo"], "--model 'foo' is neither a model this project builds (smollm2-135m, "
                         "qwen2.5-coder-0.5b, gemma3-270m) nor a .gguf file; a built model directory is "
                         "--model-path DIR"),
    (["--parallel", "0"], "--parallel must be 1 to 64 sequence slots, got 0"),
    (["--kv-cache-mib", "-2"], "--kv-cache-mib must be -1 (one context's worth) or 0 or more, got -2"),
    (["--keep", "-5"], "--keep must be -1 (the system prompt's tokens) or 0 or more, got -5"),
    (["--max-context", "-1"], "--max-context must be 0 (the whole context) or more, got -1"),
    (["--metrics-auth", "bogus"], "--metrics-auth must be one of open, key, got 'bogus'"),
    (["--port", "70000"], "--port must be 0 to 65535, got 70000"),
    (["--quantize", "q4_k_m"], "--quantize must be one of none, 8da4w, 8da8w, got 'q4_k_m'"),
    (["--threads", "two"], "threads must be an integer, got 'two'"),
])
def test_a_bad_value_is_one_line_before_anything_starts(args, says):
    proc = _etserve(*args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"etserve: error: {says}"
    assert "Traceback" not in proc.stderr and "gunicorn" not in proc.stderr.lower()


def test_plain_gunicorn_stops_on_the_same_line():
    env = {**_env(), "ETSERVE_METRICS_AUTH": "bogus"}
    proc = subprocess.run([sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "etserve: --metrics-auth must be one of open, key, got 'bogus'" in proc.stderr
    assert "Traceback" not in proc.stderr and "Booting worker" not in proc.stderr


def test_a_port_in_use_is_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _etserve("--model-path", "/nonexistent", "--host", "127.0.0.1", "--port", str(port))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == \
        [f"etserve: 127.0.0.1:{port} is in use (another server?); choose another with --port"]
