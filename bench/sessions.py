"""What sessions save: time to first token of a conversation's second turn after
another conversation took the model, with the first turn's KV state restored
(warm) or prefilled again (cold); and what a switch costs natively.

    python bench/sessions.py [MODEL_DIR] [--history 1500] [--threads 2] [--repeat 2]

MODEL_DIR defaults to the default model's custom-op export (Qwen2.5-Coder-0.5B,
ctx 2048, 8da4w). The HTTP part serves it with the real gunicorn config on a
free port; the native part (snapshot / restore / prefill of the same number
of positions) runs in this process once the server has stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.engine import NativeModel, set_num_threads  # noqa: E402
from app.text.chat_template import ChatTemplate  # noqa: E402
from app.text.tokenizer import Tokenizer  # noqa: E402

DEFAULT_MODEL = Path.home() / ".cache/etserve/models/qwen2.5-coder-0.5b/ctx2048-8da4w-sdpa"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def source_text(seed: str, n: int) -> str:
    """Deterministic code-like text of n functions."""
    return "".join(f"def {seed}_{i}(x, y):\n    \"\"\"Combine x and y, variant {i}.\"\"\"\n"
                   f"    return x * {i % 17 + 2} + y - {i * 3 % 11}\n\n" for i in range(n))


def history_messages(tokenizer: Tokenizer, template: ChatTemplate, seed: str, target: int) -> list[dict]:
    """A first user turn whose rendered prompt is about `target` tokens."""
    n = 4
    while True:
        messages = [{"role": "user", "content": "Review this module:\n\n" + source_text(seed, n)}]
        size = len(tokenizer.encode(template.render(messages, add_generation_prompt=True)))
        if size >= target:
            return messages
        n += max(1, (target - size) // 40)


class Server:
    def __init__(self, model_dir: Path, threads: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, ETSERVE_MODEL_PATH=str(model_dir), ETSERVE_PORT=str(self.port),
                   ETSERVE_HOST="127.0.0.1", ETSERVE_THREADS=str(threads))
        self.log = tempfile.NamedTemporaryFile(prefix="etserve-bench-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py")],
                                     cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited; log: {self.log.name}")
            try:
                if requests.get(self.url + "/health", timeout=1).json().get("status") == "ok":
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise SystemExit(f"server not ready; log: {self.log.name}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)

    def chat(self, messages: list[dict], session: str, max_tokens: int) -> tuple[dict, float]:
        """A streamed greedy chat turn: (the final message and usage, seconds to the first token)."""
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "session_id": session}
        t0 = time.perf_counter()
        ttft, text, usage = None, [], None
        with requests.post(self.url + "/v1/chat/completions", json=body, stream=True, timeout=600) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk["choices"]:
                    delta = choice["delta"]
                    if ttft is None and ("content" in delta and delta["content"] or choice["finish_reason"]):
                        ttft = time.perf_counter() - t0
                    text.append(delta.get("content") or "")
        return {"content": "".join(text), "usage": usage}, ttft


def http_part(model_dir: Path, history: int, threads: int, repeat: int) -> dict:
    tokenizer = Tokenizer.from_dir(model_dir)
    template = ChatTemplate(tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token)
    first = history_messages(tokenizer, template, "alpha", history)
    other = history_messages(tokenizer, template, "beta", history)
    server = Server(model_dir, threads)
    rows = []
    try:
        for _ in range(repeat):
            warm_id, other_id = f"warm-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
            reply, _ = server.chat(first, warm_id, 48)
            turn2 = first + [{"role": "assistant", "content": reply["content"]},
                             {"role": "user", "content": "Add type hints to the first function."}]
            server.chat(other, other_id, 8)  # another conversation takes the cache
            cold, cold_s = server.chat(turn2, f"cold-{uuid.uuid4().hex[:6]}", 8)  # nothing saved for it
            server.chat(other, other_id, 8)  # the other conversation again (restored, cheap)
            warm, warm_s = server.chat(turn2, warm_id, 8)  # turn 1 restored, only the new turn prefilled
            rows.append({
                "prompt_tokens": warm["usage"]["prompt_tokens"],
                "turn1_tokens": reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"],
                "cold_cached": cold["usage"]["prompt_tokens_details"]["cached_tokens"],
                "warm_cached": warm["usage"]["prompt_tokens_details"]["cached_tokens"],
                "cold_ttft_s": round(cold_s, 3),
                "warm_ttft_s": round(warm_s, 3),
                "ratio": round(warm_s / cold_s, 4),
                "same_text": warm["content"] == cold["content"],
            })
            print(json.dumps(rows[-1]), flush=True)
        listing = requests.get(server.url + "/v1/sessions", timeout=10).json()
    finally:
        server.stop()
    return {"rows": rows, "ratio_median": statistics.median(r["ratio"] for r in rows),
            "sessions_used_mib": round(listing["used_bytes"] / 2**20, 1)}


def native_part(model_dir: Path, positions: int, threads: int, reps: int = 5) -> dict:
    set_num_threads(threads)
    model = NativeModel(model_dir / "model.pte")
    ids = [1000 + (i * 7919) % 20000 for i in range(positions)]
    chunk = min(128, model.info.max_prefill_len)
    t0 = time.perf_counter()
    for pos in range(0, positions, chunk):
        model.forward(ids[pos:pos + chunk], pos)
    prefill_s = time.perf_counter() - t0
    info = model.kv_info()
    snaps, restores = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        data = model.kv_snapshot(positions)
        snaps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        model.kv_restore(positions, data)
        restores.append(time.perf_counter() - t0)
    model.close()
    return {
        "positions": positions,
        "n_caches": info.n_caches,
        "bytes_per_position": info.bytes_per_position,
        "snapshot_mib": round(positions * info.bytes_per_position / 2**20, 1),
        "snapshot_ms": round(statistics.median(snaps) * 1000, 2),
        "restore_ms": round(statistics.median(restores) * 1000, 2),
        "prefill_ms": round(prefill_s * 1000, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--history", type=int, default=1500, help="tokens of the first turn's prompt")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--skip-http", action="store_true")
    args = p.parse_args()
    if not (args.model / "model.pte").exists():
        raise SystemExit(f"no model at {args.model}")
    if not args.skip_http:
        http = http_part(args.model, args.history, args.threads, args.repeat)
        print(f"turn-2 time to first token, warm / cold: {http['ratio_median']:.3f} "
              f"(median of {len(http['rows'])}; target <= 0.15); saved sessions: {http['sessions_used_mib']} MiB")
    native = native_part(args.model, args.history, args.threads)
    print(json.dumps(native))
    print(f"switch cost at {native['positions']} positions: snapshot {native['snapshot_ms']} ms + restore "
          f"{native['restore_ms']} ms vs prefill {native['prefill_ms']} ms "
          f"({native['snapshot_mib']} MiB, {native['bytes_per_position']} bytes/position)")


if __name__ == "__main__":
    main()
