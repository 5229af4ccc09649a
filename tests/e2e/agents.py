"""The npm coding agents `make agents` installs (pinned), as the e2e tests run them: where they
are, the pinned version check, and one non-interactive turn with JSON-lines output."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import requests

AGENTS_DIR = Path(os.environ.get("ETSERVE_AGENTS_DIR", Path.home() / ".cache" / "etserve" / "agents"))
CLOSED_REGISTRY = "http://127.0.0.1:9/"  # the discard port: a client that would fetch packages fetches nothing


def installed(name: str, version: str, home: Path) -> Path:
    """The agent's binary, failing the test if `make agents` has not installed it at `version`."""
    binary = AGENTS_DIR / "node_modules" / ".bin" / name
    if not binary.exists():
        pytest.fail(f"{name} is not installed at {binary}: run `make agents`")
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60,
                         env={"PATH": os.environ["PATH"], "HOME": str(home)})
    assert version in out.stdout + out.stderr, out.stdout + out.stderr
    return binary


def run_turn(argv: list[str], cwd: Path, env: dict, server, timeout: float) -> tuple[list[dict], list[tuple]]:
    """One turn run to its end: the JSON lines it printed, and the access-log entries (status,
    prompt, cached, completion) of the /v1/chat/completions requests it made."""
    since = server.log_size()
    proc = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return events, server.generations_logged(since)


def served_model(server) -> tuple[str, int]:
    """The served model's id and context length, as /v1/models lists them (what a client's
    configuration names)."""
    info = requests.get(server.base_url + "/v1/models", timeout=10).json()["data"][0]
    return info["id"], info["context_length"]
