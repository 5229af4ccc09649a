"""What the benchmarks share: model directories, prompts, the decode loop, a served model
over HTTP, /health polling, worker processes that hold one model each, memory bandwidth.

Nothing here builds or writes a model: a missing build is reported by the caller.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app.models.registry import cache_root, default_model_dir as registry_default_dir  # noqa: E402

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
# The default build may be in the middle of a rebuild as another variant: this one is then used.
FALLBACK_VARIANT = "ctx2048-8da4w-sdpa"


def models_root() -> Path:
    return cache_root() / "models"


def is_built(directory: Path | None) -> bool:
    """A complete build: the manifest is written last, after model.pte."""
    return directory is not None and (directory / "model.pte").is_file() and (directory / "etserve.json").is_file()


def default_model_dir() -> Path:
    """The default served model's directory, or the fallback variant while it is not built."""
    directory = registry_default_dir(DEFAULT_MODEL)
    fallback = models_root() / DEFAULT_MODEL / FALLBACK_VARIANT
    return directory if is_built(directory) or not is_built(fallback) else fallback


def built_models() -> list[Path]:
    return sorted(p.parent for p in models_root().glob("*/*/etserve.json") if is_built(p.parent))


def model_json(directory: Path, name: str) -> dict:
    return json.loads((directory / name).read_text())


# --- prompts ---------------------------------------------------------------------------

def filler(n: int, vocab: int) -> list[int]:
    """Deterministic ordinary token ids (no specials at the bottom of the vocabulary)."""
    return [1000 + (i * 7919) % (min(vocab, 30000) - 1000) for i in range(n)]


def source_text(seed: str, n: int) -> str:
    """Deterministic code-like text of n functions: a model continues it for as long as asked."""
    return "".join(f"def {seed}_{i}(x, y):\n    \"\"\"Combine x and y, variant {i}.\"\"\"\n"
                   f"    return x * {i % 17 + 2} + y - {i * 3 % 11}\n\n" for i in range(n))


def grow_to(target: int, size_of: Callable[[int], int]) -> int:
    """The smallest number of source_text functions whose rendering is >= target tokens."""
    n = 1
    while True:
        size = size_of(n)
        if size >= target:
            return n
        n += max(1, (target - size) // 40)


def code_prompt(tokenizer, seed: str, target: int) -> str:
    """A raw completion prompt of about `target` tokens."""
    return source_text(seed, grow_to(target, lambda n: len(tokenizer.encode(source_text(seed, n)))))


def history_messages(tokenizer, template, seed: str, target: int) -> list[dict]:
    """A first user turn whose rendered chat prompt is about `target` tokens."""
    def messages(n: int) -> list[dict]:
        return [{"role": "user", "content": "Review this module:\n\n" + source_text(seed, n)}]

    def size(n: int) -> int:
        return len(tokenizer.encode(template.render(messages(n), add_generation_prompt=True)))

    return messages(grow_to(target, size))


def load_tokenizer(model_dir: Path):
    """The server's own tokenizer and chat template for a model directory."""
    from app.text.chat_template import ChatTemplate
    from app.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(model_dir)
    return tokenizer, ChatTemplate(tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token)


# --- the decode loop -------------------------------------------------------------------

def fills_within(max_seq_len: int, fills: Sequence[int], steps: int) -> list[int]:
    """The fills whose decode steps fit the context; a fill that does not fit is replaced
    by the largest one that does (once)."""
    largest = max_seq_len - steps - 1
    fit = [f for f in fills if f <= largest]
    if len(fit) < len(fills) and (not fit or fit[-1] < largest):
        fit.append(largest)
    return fit


def decode_fills(forward: Callable[[Sequence[int], int], None], choose: Callable[[], int],
                 ids: Sequence[int], fills: Sequence[int], steps: int, chunk: int) -> list[dict]:
    """For each fill in turn: prefill `ids` up to it in chunks (only what no earlier fill
    prefilled: the cache is filled once, to the largest fill so far), pick the first token
    (untimed, as a server's time to first token), then time `steps` decode steps (forward one
    token + pick the next). Fills may repeat in any order (128, 1500, 1500, 128) to alternate
    measurements; a decode overwrites positions after its fill, which stay filled all the same."""
    results, filled = [], 0
    for fill in fills:
        t0 = time.perf_counter()
        for start in range(filled, fill, chunk):
            forward(ids[start:min(start + chunk, fill)], start)
        prefill_s = time.perf_counter() - t0
        prefilled, filled = max(0, fill - filled), max(filled, fill)
        token = choose()
        t0 = time.perf_counter()
        for k in range(steps):
            forward([token], fill + k)
            token = choose()
        results.append({"fill": fill, "decode_tok_s": steps / (time.perf_counter() - t0),
                        "prefill_tok_s": prefilled / prefill_s if prefilled else None})
    return results


# --- a served model --------------------------------------------------------------------

@dataclass
class Stream:
    """One streamed generation as the client saw it."""

    text: str
    usage: dict | None
    ttft: float  # seconds from sending to the first generated text (or the end)
    first: float  # perf_counter of the first and last chunk carrying text
    last: float

    @property
    def completion_tokens(self) -> int:
        return self.usage["completion_tokens"]

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first over the time between the first and the last one."""
        return (self.completion_tokens - 1) / (self.last - self.first)


class Server:
    """The real gunicorn config serving one model directory on a free port, started by the
    tests' own Server (tests/e2e/servers.py)."""

    def __init__(self, model_dir: Path, threads: int, extra_env: dict[str, str] | None = None):
        from tests.e2e.servers import Server as TestServer

        self._server = TestServer(model_dir, {"ETSERVE_THREADS": str(threads), **(extra_env or {})})
        self.proc, self.url = self._server.proc, self._server.base_url
        try:
            self._server.wait_ready(timeout=300)
        except Exception:
            self.stop()
            raise

    def stop(self) -> None:
        self._server.stop()

    def get_json(self, path: str) -> dict:
        import requests

        return requests.get(self.url + path, timeout=30).json()

    def stream(self, path: str, body: dict) -> Stream:
        """POST a streamed chat or text completion and read it to the end."""
        import requests

        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        t0 = time.perf_counter()
        ttft = first = last = None
        text, usage = [], None
        with requests.post(self.url + path, json=body, stream=True, timeout=900) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                now = time.perf_counter()
                for choice in chunk["choices"]:
                    piece = choice["delta"].get("content") if "delta" in choice else choice.get("text")
                    if piece:
                        first = first or now
                        last = now
                        text.append(piece)
                    if ttft is None and (piece or choice.get("finish_reason")):
                        ttft = now - t0
        return Stream("".join(text), usage, ttft, first or t0, last or t0)

    def chat(self, messages: list[dict], session: str, max_tokens: int) -> Stream:
        """A streamed greedy chat turn in a named session."""
        return self.stream("/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens,
                                                    "temperature": 0, "session_id": session})

    def worker_pid(self) -> int:
        """The gunicorn worker: the master's (only) child."""
        pid = self.proc.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return int(children[0])

    def worker_memory(self) -> dict[str, int]:
        """The worker's VmRSS, RssAnon and RssFile (/proc/PID/status), in bytes."""
        fields = {}
        for line in Path(f"/proc/{self.worker_pid()}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile"):
                fields[name] = int(value.split()[0]) * 1024
        return fields


class HealthPoller:
    """GET /health at `hz` in a thread until stopped; latencies in seconds (None: failed)."""

    def __init__(self, url: str, hz: float = 20.0):
        self.url, self.period = url + "/health", 1.0 / hz
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import requests

        with requests.Session() as session:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    session.get(self.url, timeout=5).raise_for_status()
                    self.latencies.append(time.perf_counter() - t0)
                except requests.RequestException:
                    self.failures += 1
                self._stop.wait(max(0.0, self.period - (time.perf_counter() - t0)))

    def __enter__(self) -> "HealthPoller":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


# --- worker processes ------------------------------------------------------------------

class WorkerError(RuntimeError):
    pass


class Worker:
    """A subprocess (bench/workers.py) holding one .pte in one runtime: ours (libetserve.so),
    ExecuTorch's kernels through the wheel's pybinding, or ExecuTorch's LLM runner. The
    torch-linked kernels register into the same runtime library as ours, so each runtime
    gets its own process. Loads once (in the background until `info` is read), then
    answers `call`s (JSON lines)."""

    def __init__(self, kind: str, model_dir: Path, threads: int):
        self.kind = kind
        self.log = tempfile.NamedTemporaryFile(prefix=f"etserve-bench-{kind}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.workers", kind, str(model_dir), "--threads", str(threads)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self._info: dict | None = None

    @property
    def info(self) -> dict:
        """What the model says about itself, once loaded; WorkerError if it did not load."""
        if self._info is None:
            self._info = self._reply()
        return self._info

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            tail = Path(self.log.name).read_text(errors="replace").strip().splitlines()[-3:]
            raise WorkerError(f"{self.kind} worker exited ({self.proc.returncode}): " + " | ".join(tail))
        reply = json.loads(line)
        if "error" in reply:
            raise WorkerError(reply["error"])
        return reply

    def call(self, op: str, **args) -> dict:
        self.info  # noqa: B018 (wait for the model)
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.log.closed:
            return
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # the worker ends at the end of its input
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- the machine -----------------------------------------------------------------------

def memory_bandwidth(threads: int, gib: float = 1.0, reps: int = 3) -> float:
    """Bytes/s of a numpy copy of a `gib` GiB array split over `threads` threads (numpy releases
    the GIL while copying), best of `reps`; bytes read plus bytes written, as STREAM counts."""
    import numpy as np

    src = np.ones(int(gib * 2**30) // 8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    bounds = np.linspace(0, len(src), threads + 1, dtype=int)
    parts = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    best = float("inf")
    for _ in range(reps):
        workers = [threading.Thread(target=np.copyto, args=(dst[p], src[p])) for p in parts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def median(values: Sequence[float]) -> float:
    return statistics.median(values)
