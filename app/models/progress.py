"""Stage lines with elapsed seconds on stderr (``[1/5] reading GGUF… 3.2s``), and a closing table
of every stage's wall seconds, CPU seconds (both cores busy: up to twice the wall time), peak
resident memory and peak anonymous memory.

Resident memory (VmHWM) counts the pages of mapped files too: a checkpoint mapped from disk
(app/models/checkpoint.py) shows there as long as the page cache keeps it, though the kernel
drops those pages when memory runs short. Anonymous memory (RssAnon, sampled every 50 ms by the
stage's timer thread) is what the build really holds: what must fit in the machine's RAM."""

from __future__ import annotations

import os
import re
import resource
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional, TextIO


@dataclass
class StageRecord:
    label: str
    seconds: float
    cpu_seconds: float  # this process and the children it waited for
    peak_rss_mb: Optional[float]  # this process's peak during the stage (None: not measurable)
    ok: bool
    peak_anon_mb: Optional[float] = None  # peak anonymous resident memory, sampled (None: not measurable)


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _reset_peak_rss() -> bool:
    """Restart the kernel's peak-RSS counter (VmHWM) of this process; False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_mb() -> Optional[float]:
    try:
        with open("/proc/self/status") as f:
            m = re.search(r"^VmHWM:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        m = None
    return round(int(m.group(1)) / 1024, 1) if m else None


def _anon_mb() -> Optional[float]:
    """This process's anonymous resident memory now (MB; None where /proc does not say)."""
    try:
        with open("/proc/self/status") as f:
            m = re.search(r"^RssAnon:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        m = None
    return round(int(m.group(1)) / 1024, 1) if m else None


ANON_SAMPLE_SECONDS = 0.05


def _maxrss_mb() -> float:
    """The kernel's peak RSS of this process (MB); restarted, like VmHWM, by ``_reset_peak_rss``."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


class Stages:
    """Numbered build stages; long stages show a live timer (tty) or a line per minute (log)."""

    def __init__(self, total: int, stream: TextIO = sys.stderr, prefix: str = "") -> None:
        self.total = total
        self.index = 0
        self.stream = stream
        self.prefix = prefix  # e.g. the model name, when several builds share a terminal
        self.started = time.monotonic()
        self.timings: dict[str, float] = {}
        self.records: list[StageRecord] = []

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    @contextmanager
    def stage(self, label: str) -> Iterator[None]:
        self.index += 1
        prefix = f"{self.prefix}[{self.index}/{self.total}] {label}…"
        tty = self.stream.isatty()
        t0 = time.monotonic()
        cpu0 = _cpu_seconds()
        measured = _reset_peak_rss()
        done = threading.Event()
        anon: list[Optional[float]] = [_anon_mb()]

        def tick() -> None:
            period = 1.0 if tty else 60.0
            next_line = time.monotonic() + period
            while not done.wait(ANON_SAMPLE_SECONDS):
                now_anon = _anon_mb()
                if now_anon is not None and (anon[0] is None or now_anon > anon[0]):
                    anon[0] = now_anon
                if time.monotonic() >= next_line:
                    next_line += period
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
            last = _anon_mb()
            if last is not None and (anon[0] is None or last > anon[0]):
                anon[0] = last
            self.timings[label] = round(elapsed, 1)
            self.records.append(StageRecord(label, round(elapsed, 1), round(_cpu_seconds() - cpu0, 1),
                                            _peak_rss_mb() if measured else None, ok, anon[0]))
            status = f"{elapsed:.1f}s" if ok else f"FAILED after {elapsed:.1f}s"
            self._write(f"\r{prefix} {status}\n" if tty else f"{prefix} {status}\n")

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def peak_rss_mb(self) -> float:
        """Peak resident memory of this process over all stages so far (MB)."""
        return max([r.peak_rss_mb for r in self.records if r.peak_rss_mb is not None] + [_maxrss_mb()])

    def peak_anon_mb(self) -> Optional[float]:
        """Peak anonymous resident memory over all stages so far (MB; None: not measurable)."""
        values = [r.peak_anon_mb for r in self.records if r.peak_anon_mb is not None]
        return max(values) if values else None

    def summary(self) -> str:
        """The table of stages: wall seconds, CPU seconds, peak RSS, and the whole build's line."""
        width = max([len(r.label) for r in self.records] + [5])
        gb = lambda mb: f"{mb / 1024:.2f} GB" if mb is not None else "-"  # noqa: E731
        lines = [f"{self.prefix}{'stage':<{width}}  {'seconds':>8}  {'cpu s':>8}  {'peak RSS':>9}  {'peak anon':>9}"]
        for r in self.records:
            flag = "" if r.ok else "  FAILED"
            lines.append(f"{self.prefix}{r.label:<{width}}  {r.seconds:8.1f}  {r.cpu_seconds:8.1f}  "
                         f"{gb(r.peak_rss_mb):>9}  {gb(r.peak_anon_mb):>9}{flag}")
        total_cpu = sum(r.cpu_seconds for r in self.records)
        lines.append(f"{self.prefix}{'total':<{width}}  {self.elapsed():8.1f}  {total_cpu:8.1f}  "
                     f"{gb(self.peak_rss_mb()):>9}  {gb(self.peak_anon_mb()):>9}")
        return "\n".join(lines)
