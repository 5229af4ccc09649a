"""The pids of a gunicorn master's worker processes (to see that a request did not kill one)."""

from __future__ import annotations

from pathlib import Path


def worker_pids(master_pid: int) -> frozenset[int]:
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children")
    return frozenset(int(p) for p in children.read_text().split())
