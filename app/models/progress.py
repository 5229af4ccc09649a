"""Stage lines with elapsed seconds on stderr: ``[1/5] reading GGUF… 3.2s``."""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator, TextIO


class Stages:
    """Numbered build stages; long stages show a live timer (tty) or a line per minute (log)."""

    def __init__(self, total: int, stream: TextIO = sys.stderr) -> None:
        self.total = total
        self.index = 0
        self.stream = stream
        self.started = time.monotonic()
        self.timings: dict[str, float] = {}

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    @contextmanager
    def stage(self, label: str) -> Iterator[None]:
        self.index += 1
        prefix = f"[{self.index}/{self.total}] {label}…"
        tty = self.stream.isatty()
        t0 = time.monotonic()
        done = threading.Event()

        def tick() -> None:
            period = 1.0 if tty else 60.0
            while not done.wait(period):
                elapsed = time.monotonic() - t0
                self._write(f"\r{prefix} {elapsed:.0f}s" if tty else f"{prefix} still running, {elapsed:.0f}s\n")

        if tty:
            self._write(prefix)
        timer = threading.Thread(target=tick, daemon=True)
        timer.start()
        ok = False
        try:
            yield
            ok = True
        finally:
            done.set()
            timer.join()
            elapsed = time.monotonic() - t0
            self.timings[label] = round(elapsed, 1)
            status = f"{elapsed:.1f}s" if ok else f"FAILED after {elapsed:.1f}s"
            self._write(f"\r{prefix} {status}\n" if tty else f"{prefix} {status}\n")

    def elapsed(self) -> float:
        return time.monotonic() - self.started
