"""Footprint of a serve-only install (issue 16): its size on disk, the time from starting `etserve`
to a ready /health, and the gunicorn worker's memory idle and after a request, for one model.

    make serve-only                    # the serve-only virtualenv, serve-venv/ (wheel, no extras)
    python -m bench.footprint [--venv serve-venv] [--model-dir DIR] [--json]

Standalone (stdlib only, like what it measures); builds nothing: a missing virtualenv or model
is reported as not built. The model defaults to the default model's build. Memory is VmRSS of
/proc (with its anonymous and file-backed parts); the request is a greedy 64-token chat
completion. Startup is measured from the spawn of `etserve` (gunicorn master, worker boot,
the manifest check of every file's SHA-256, the model load) to the first /health "ok".
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = "qwen2.5-coder-0.5b"


def disk_usage(path: Path) -> int:
    """Bytes allocated on disk under `path`, hard links once."""
    seen, total = set(), 0
    for p in [path, *path.rglob("*")]:
        st = p.lstat()
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def default_model_dir() -> Path:
    sys.path.insert(0, str(ROOT))
    from app.models.registry import default_model_dir as model_dir

    return model_dir(DEFAULT_MODEL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon and RssFile of a process, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def worker_pid(master: int, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise RuntimeError("the gunicorn worker did not start")


def get_json(url: str, body: dict | None = None, timeout: float = 300) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def measure(venv: Path, model_dir: Path, threads: int) -> dict:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}  # nothing of the checkout
    with tempfile.TemporaryDirectory() as cwd, tempfile.TemporaryFile() as log:
        started = time.monotonic()
        proc = subprocess.Popen([str(venv / "bin" / "etserve"), "--model-path", str(model_dir), "--port", str(port),
                                 "--threads", str(threads)], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                if proc.poll() is not None or time.monotonic() - started > 600:
                    log.seek(0)
                    raise RuntimeError(f"etserve did not become ready:\n{log.read().decode(errors='replace')[-3000:]}")
                try:
                    status, health = get_json(base + "/health", timeout=2)
                    if health.get("status") == "ok":
                        break
                    if health.get("status") == "failed":
                        raise RuntimeError(f"the model failed to load: {health}")
                except OSError:
                    pass
                time.sleep(0.05)
            ready = time.monotonic() - started
            worker = worker_pid(proc.pid)
            time.sleep(2)  # let the worker settle after the load
            idle = memory(worker)
            master = memory(proc.pid)
            status, body = get_json(base + "/v1/chat/completions", {
                "messages": [{"role": "user", "content": "Write a C function that reverses a string."}],
                "max_tokens": 64, "temperature": 0})
            if status != 200:
                raise RuntimeError(f"the request failed: {status} {body}")
            after = memory(worker)
            log.seek(0)
            text = log.read().decode(errors="replace")
            check = next((line.partition("matches its etserve.json (")[2].rstrip(")") for line in text.splitlines()
                          if "matches its etserve.json (" in line), "no etserve.json: not checked")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return {"ready_seconds": round(ready, 2), "manifest_check": check, "worker_idle": idle,
            "worker_after_request": after, "master": master, "completion_tokens": body["usage"]["completion_tokens"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.footprint", description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=str(ROOT / "serve-venv"), help="the serve-only virtualenv (make serve-only)")
    ap.add_argument("--dev-venv", default=str(ROOT / ".venv"), help="the development virtualenv, for the ratio")
    ap.add_argument("--model-dir", default=None, help=f"a built model directory (default: {DEFAULT_MODEL}'s)")
    ap.add_argument("--threads", type=int, default=0, help="runtime threads (0: one per core)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)
    venv, dev = Path(args.venv), Path(args.dev_venv).resolve()
    model_dir = Path(args.model_dir) if args.model_dir else default_model_dir()
    result: dict = {"venv": str(venv), "model_dir": str(model_dir)}
    if not (venv / "bin" / "etserve").exists():
        result["error"] = f"n/a (not built: make serve-only SERVE_VENV={venv})"
    elif not (model_dir / "model.pte").exists():
        result["error"] = f"n/a (not built: {model_dir})"
    else:
        result["install_bytes"] = disk_usage(venv)
        if dev.is_dir():
            result["dev_venv_bytes"] = disk_usage(dev)
        result["pte_bytes"] = (model_dir / "model.pte").stat().st_size
        result.update(measure(venv, model_dir, args.threads))
    if args.json:
        print(json.dumps(result))
        return 0 if "error" not in result else 1
    if "error" in result:
        print(result["error"])
        return 1
    mib = 1 << 20

    def mem(m: dict) -> str:
        return f"{m['VmRSS'] / mib:.0f} MiB (anonymous {m['RssAnon'] / mib:.0f}, file {m['RssFile'] / mib:.0f})"

    print(f"model: {model_dir} (.pte {result['pte_bytes'] / mib:.0f} MiB)")
    ratio = f" = {result['install_bytes'] / result['dev_venv_bytes']:.3f} of the development venv " \
            f"({result['dev_venv_bytes'] / 1e6:.0f} MB)" if "dev_venv_bytes" in result else ""
    print(f"serve-only install on disk      {result['install_bytes'] / 1e6:.0f} MB{ratio}")
    print(f"start to ready /health          {result['ready_seconds']:.2f} s "
          f"(manifest check: {result['manifest_check']})")
    print(f"worker RSS idle                 {mem(result['worker_idle'])}")
    print(f"worker RSS after a request      {mem(result['worker_after_request'])} "
          f"({result['completion_tokens']} tokens generated)")
    print(f"gunicorn master RSS             {mem(result['master'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
