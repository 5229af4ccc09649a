"""Server processes the bench starts on a free loopback port: etserve under the real gunicorn
config, and the peer, llama.cpp's llama-server (bench/peer.py builds it). Each is one process
tree the bench owns: started here, stopped here, its memory read from /proc."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_memory(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon and RssFile of a process (/proc/PID/status), in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon", "RssFile"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


class ServerProcess:
    """A server on 127.0.0.1:<free port>, its output in a temporary log (deleted when stopped
    cleanly, kept and named when it failed to start)."""

    name = "server"

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, ready_timeout: float = 600):
        self.log_path = Path(tempfile.mkstemp(prefix=f"etserve-bench-{self.name}-", suffix=".log")[1])
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **(env or {})},
                                     stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready(ready_timeout)
        except Exception:
            self.stop(keep_log=True)
            raise

    url: str

    def _is_ready(self, response: requests.Response) -> bool:
        return response.ok

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: "
                                   f"{self.log_path.read_text(errors='replace')[-2000:]}")
            try:
                if self._is_ready(requests.get(self.url + "/health", timeout=2)):
                    return
            except requests.RequestException:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} not ready in {timeout:.0f} s (log {self.log_path})")

    def serving_pid(self) -> int:
        """The process that holds the model."""
        return self.proc.pid

    def memory(self) -> dict[str, int]:
        return process_memory(self.serving_pid())

    def stop(self, keep_log: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._log.closed:
            self._log.close()
            if not keep_log:
                self.log_path.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# etserve's environment for a server that decodes one token a step: what a row comparing plain
# decoding (llama-server without speculation, a bare native loop) runs; bench/speculation.py
# measures the drafts themselves
NO_DRAFTS = {"ETSERVE_DRAFT_MAX": "0"}


class EtServe(ServerProcess):
    """etserve serving one model directory under the real gunicorn config (one gevent worker)."""

    name = "etserve"

    def __init__(self, model_dir: Path, threads: int, extra_env: dict[str, str] | None = None):
        self.model_dir = model_dir
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {"ETSERVE_MODEL_PATH": str(model_dir), "ETSERVE_HOST": "127.0.0.1", "ETSERVE_PORT": str(port),
               "ETSERVE_THREADS": str(threads), **(extra_env or {})}
        super().__init__([sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py")], env)

    def _is_ready(self, response: requests.Response) -> bool:
        return response.ok and response.json().get("status") == "ok"

    def serving_pid(self) -> int:
        """The gunicorn worker: the master's (only) child."""
        pid = self.proc.pid
        return int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])


class LlamaServer(ServerProcess):
    """llama.cpp's llama-server on one GGUF: `threads` threads for decode and prompt processing
    alike, one slot (-np 1: one request at a time) unless `parallel` says otherwise (None: its
    default slots, for the shared-box rows), `ctx` positions, on
    127.0.0.1 only, and no prompt cache in RAM besides the slot's own (--cache-ram 0: its default
    keeps up to 8 GiB of earlier prompts' states, which etserve does not). Everything else stays
    at the program's defaults (mmap'd weights, f16 KV cache, its batch sizes, flash attention
    when it chooses); requests say `cache_prompt: false` where a cold prompt is measured."""

    name = "llama-server"

    def __init__(self, program: Path, gguf: Path, threads: int, ctx: int, extra_args: tuple[str, ...] = (),
                 parallel: int | None = 1):
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.ctx = ctx
        slots = ["-np", str(parallel)] if parallel is not None else []  # None: its default slots
        super().__init__([str(program), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                          "-t", str(threads), "-tb", str(threads), "-c", str(ctx), *slots,
                          "--no-webui", "--cache-ram", "0", *extra_args], ready_timeout=300)
