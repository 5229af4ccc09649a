"""A real gunicorn process serving the app on a free loopback port, for the e2e tests
(tests/conftest.py builds its fixtures on it; tests that start servers of their own import it)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A real gunicorn process serving the app on a free loopback port."""

    def __init__(self, model_path: Path, extra_env: dict[str, str] | None = None):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        env.update({
            "ETSERVE_MODEL_PATH": str(model_path),
            "ETSERVE_PORT": str(self.port),
            "ETSERVE_HOST": "127.0.0.1",
            "ETSERVE_THREADS": "2",
        })
        env.update(extra_env or {})
        self.log_path = ROOT / "test-artifacts" / f"server-{self.port}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py")],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 120, status: str = "ok") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; log: {self.log_path.read_text()[-4000:]}")
            try:
                if requests.get(self.base_url + "/health", timeout=1).json().get("status") == status:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready in {timeout}s; log: {self.log_path.read_text()[-4000:]}")

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def generations_logged(self, since: int, path: str = "/v1/chat/completions") -> list[tuple[int, ...]]:
        """(status, prompt, cached, completion) of each POST to `path` in the access log after
        `since` bytes (log_size before the requests)."""
        line = re.compile(r'"POST ' + re.escape(path) + r' HTTP/1\.1" (\d{3}) .*? prompt=(\d+) cached=(\d+) completion=(\d+)')
        log = self.log_path.read_bytes()[since:].decode(errors="replace")
        return [tuple(int(x) for x in m) for m in line.findall(log)]

    def health(self) -> dict:
        return requests.get(self.base_url + "/health", timeout=5).json()

    def wait_idle(self, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h = self.health()
            if not h["engine"]["generating"]:
                return h
            time.sleep(0.02)
        raise AssertionError("engine still generating")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
