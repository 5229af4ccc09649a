"""Admission for CPU work a request does outside the engine (tokenizing a multi-megabyte body,
rendering a template): off the event loop, and only so many at once.

The work runs in gevent's thread pool (app/engine/offload.run_blocking), so the hub keeps
serving other sockets, /health and the streams of other clients meanwhile; past `limit` such
requests in flight a new one is refused at once (`Busy`, a 429 with Retry-After) instead of
queueing without bound.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from app.engine.offload import run_blocking

T = TypeVar("T")


class Busy(Exception):
    """Too many requests of this kind in flight: a 429 (app/http/errors.to_api_error)."""

    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class Offload:
    def __init__(self, name: str, limit: int = 2):
        self.name = name
        self.limit = limit
        self.in_flight = 0  # greenlets share one thread: no lock needed around it

    def run(self, fn: Callable[..., T], *args) -> T:
        if self.in_flight >= self.limit:
            raise Busy(f"{self.limit} {self.name} requests are already being worked on; retry shortly")
        self.in_flight += 1
        try:
            return run_blocking(fn, *args)
        finally:
            self.in_flight -= 1
