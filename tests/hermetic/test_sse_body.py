"""The streamed body's producer greenlet (app.http.sse._with_keepalive), with a real gevent
thread pool standing in for the native runtime's steps."""

from __future__ import annotations

import time

import gevent

from app.http import sse


def test_closing_an_abandoned_stream_waits_for_the_step_under_way():
    # the router frees a model once its requests' bodies are closed: a body closed while its
    # generation's step still ran in the thread pool let the model be freed under that step
    state = {"cancelled": False, "ended": None}

    def generation():
        try:
            yield b"data: 1\n\n"
            while not state["cancelled"]:  # the engine looks between steps
                gevent.get_hub().threadpool.apply(time.sleep, (0.3,))  # one step, in a native thread
                yield b"data: n\n\n"
        finally:
            state["ended"] = time.monotonic()

    body = sse._with_keepalive(generation(), 10.0, lambda: state.update(cancelled=True))
    assert next(body) == b"data: 1\n\n"
    gevent.sleep(0.05)  # the producer is in its step now
    body.close()  # the client left
    closed = time.monotonic()
    assert state["cancelled"]
    assert state["ended"] is not None and state["ended"] <= closed  # nothing of it runs any more


def test_a_stream_read_to_its_end_closes_at_once():
    body = sse._with_keepalive(iter([b"a", b"b"]), 10.0, lambda: None)
    assert list(body) == [b"a", b"b"]
