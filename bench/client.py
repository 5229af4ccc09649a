"""HTTP measurements as a client sees them: one streamed completion timed chunk by chunk, a
chat turn in a named session, and /health polled in a thread."""

from __future__ import annotations

import json
import multiprocessing
import time
from dataclasses import dataclass

import requests


@dataclass
class Stream:
    """One streamed generation as the client saw it."""

    text: str
    usage: dict | None
    ttft: float  # seconds from sending to the first generated text (or the end)
    first: float  # perf_counter of the first and last chunk carrying text
    last: float
    chunks: int  # chunks that carried text
    timings: dict | None = None  # llama.cpp's own timings, when it sends them

    @property
    def completion_tokens(self) -> int:
        if self.usage and "completion_tokens" in self.usage:
            return self.usage["completion_tokens"]
        if self.timings and "predicted_n" in self.timings:
            return self.timings["predicted_n"]
        return self.chunks

    @property
    def prompt_tokens(self) -> int | None:
        if self.usage and "prompt_tokens" in self.usage:
            return self.usage["prompt_tokens"]
        return self.timings.get("prompt_n") if self.timings else None

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first over the time between the first and the last one."""
        return (self.completion_tokens - 1) / (self.last - self.first)


def stream(url: str, path: str, body: dict, timeout: float = 3600) -> Stream:
    """POST a streamed chat or text completion (OpenAI shape) and read it to the end."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = first = last = None
    text, usage, timings, chunks = [], None, None, 0
    with requests.post(url + path, json=body, stream=True, timeout=timeout) as r:
        if not r.ok:
            raise RuntimeError(f"{url}{path}: {r.status_code} {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
            now = time.perf_counter()
            for choice in chunk.get("choices", []):
                piece = choice["delta"].get("content") if "delta" in choice else choice.get("text")
                if piece:
                    first = first or now
                    last = now
                    chunks += 1
                    text.append(piece)
                if ttft is None and (piece or choice.get("finish_reason")):
                    ttft = now - t0
    end = time.perf_counter()
    return Stream("".join(text), usage, ttft if ttft is not None else end - t0, first or t0, last or t0,
                  chunks, timings)


def chat(url: str, messages: list[dict], session: str, max_tokens: int) -> Stream:
    """A streamed greedy chat turn in a named etserve session."""
    return stream(url, "/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens,
                                                "temperature": 0, "session_id": session})


def get_json(url: str, path: str) -> dict:
    return requests.get(url + path, timeout=30).json()


def _poll_health(url: str, period: float, stop, conn) -> None:
    """HealthPoller's loop, in a process of its own: the latencies and failures sent on stop."""
    latencies, failures = [], 0
    with requests.Session() as session:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                session.get(url, timeout=5).raise_for_status()
                latencies.append(time.perf_counter() - t0)
            except requests.RequestException:
                failures += 1
            stop.wait(max(0.0, period - (time.perf_counter() - t0)))
    conn.send((latencies, failures))
    conn.close()


class HealthPoller:
    """GET /health at `hz` until stopped; latencies in seconds, and how many polls failed.

    The polls run in a process of their own: a thread of the bench's process waited for the
    GIL whenever the bench itself computed (loading a tokenizer, building a prompt) and
    counted that wait as the server's. Measured 2026-12-01: in-process polls saw stalls of
    170-594 ms at exactly those moments, while a separate process polling the same server at
    the same time saw none over 50 ms."""

    def __init__(self, url: str, hz: float = 20.0):
        self.url, self.period = url + "/health", 1.0 / hz
        self.latencies: list[float] = []
        self.failures = 0
        ctx = multiprocessing.get_context("spawn")  # nothing of the bench's state (threads, sockets) inherited
        self._stop = ctx.Event()
        self._recv, send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_poll_health, args=(self.url, self.period, self._stop, send), daemon=True)

    def __enter__(self) -> "HealthPoller":
        self._proc.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        try:
            if self._recv.poll(30):
                self.latencies, self.failures = self._recv.recv()
        except EOFError:  # the process died before it sent them
            pass
        self._proc.join(10)
        if not self.latencies and not self.failures:
            raise RuntimeError(f"the /health poller sent nothing (exit code {self._proc.exitcode})")

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]
