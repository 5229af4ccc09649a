"""Requests run in threads, for queueing tests (the app runs in the calling thread outside gevent)."""

from __future__ import annotations

import threading
import time


class Background:
    """`fn()` in a thread; `result()` joins it and returns its value (or raises its exception)."""

    def __init__(self, fn):
        self._value = self._error = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn):
        try:
            self._value = fn()
        except BaseException as e:  # handed to result()
            self._error = e

    def result(self, timeout: float = 30.0):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the request never finished"
        if self._error is not None:
            raise self._error
        return self._value


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def call_with_socket(app, path: str, body: dict, sock) -> tuple[str, bytes]:
    """POST `body` to the WSGI app as if it came over `sock` (gunicorn puts the client's socket in
    the environ; the app watches it for a disconnect). Returns (status line, whole body)."""
    import json

    import falcon.testing

    environ = falcon.testing.create_environ(method="POST", path=path, body=json.dumps(body),
                                            headers={"Content-Type": "application/json"})
    environ["gunicorn.socket"] = sock
    status = []
    chunks = app(environ, lambda s, h, e=None: status.append(s))
    try:
        out = b"".join(chunks)
    finally:
        getattr(chunks, "close", lambda: None)()
    return status[0], out
