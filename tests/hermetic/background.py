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


class engine_busy:
    """`with engine_busy(fake, client) as running:` one chat request holds the engine (the fake
    runtime's forward calls wait) for the block; `running.result()` is its response afterwards."""

    def __init__(self, fake, client, body: dict | None = None):
        self.fake, self.client = fake, client
        self.body = body or {"messages": [{"role": "user", "content": "busy"}]}

    def __enter__(self) -> Background:
        self.fake.runtime.hold()
        try:
            self.running = Background(lambda: self.client.simulate_post("/v1/chat/completions", json=self.body))
            wait_for(lambda: self.fake.engine.generating)
        except BaseException:
            self.fake.runtime.release()
            raise
        return self.running

    def __exit__(self, *exc) -> None:
        self.fake.runtime.release()
