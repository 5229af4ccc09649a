"""Server-sent events: JSON events, `data: [DONE]`, errors after the headers, keep-alive comments."""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator

from app.engine.offload import gevent_active

from .errors import to_api_error

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"  # an SSE comment: clients and the OpenAI SDK skip it
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode("utf-8") + b"\n\n"


def sse_stream(events: Iterator[dict[str, Any]], *, keepalive: float = 0.0,
               on_abandon: Callable[[], None] | None = None,
               on_close: Callable[[], None] | None = None) -> Iterator[bytes]:
    """The response body for `events`: each as a `data:` line, then `data: [DONE]`.

    With `keepalive` (seconds, under gevent) a comment line goes out whenever
    no event came for that long, e.g. while the request waits for the model or
    its prompt is read. `on_abandon` runs when the server closes the body
    early (the client went away); `on_close` once `events` is finished.
    """
    body = _encoded(events, on_close)
    if keepalive > 0 and gevent_active():
        return _with_keepalive(body, keepalive, on_abandon)
    return _closing(body, on_abandon)


def _encoded(events: Iterator[dict[str, Any]], on_close: Callable[[], None] | None) -> Iterator[bytes]:
    """Encode events; an error once streaming has begun becomes an error event.

    Closing this generator (the server does when the client goes away) closes
    `events`, which stops generation at once.
    """
    try:
        for payload in events:
            yield event(payload)
    except Exception as e:  # headers are sent: the error becomes an event
        yield event(to_api_error(e).to_dict())
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()
        if on_close is not None:
            on_close()
    yield DONE


def _closing(body: Iterator[bytes], on_abandon: Callable[[], None] | None) -> Iterator[bytes]:
    finished = False
    try:
        yield from body
        finished = True
    finally:
        if not finished and on_abandon is not None:
            on_abandon()
        body.close()


_END = object()


def _with_keepalive(body: Iterator[bytes], interval: float, on_abandon: Callable[[], None] | None) -> Iterator[bytes]:
    """`body` runs in its own greenlet and hands chunks over a queue; this side
    waits on the queue with a timeout and sends KEEPALIVE when it expires.

    The producer is never killed (it may be inside a native call in the thread
    pool): when the client leaves, `on_abandon` cancels the request, and the
    engine stops at its next token or prefill chunk, which ends the producer.
    The queue is unbounded, so a producer whose reader left never blocks.
    """
    import gevent
    from gevent.queue import Empty, Queue

    chunks: Queue = Queue()

    def produce() -> None:
        try:
            for chunk in body:
                chunks.put(chunk)
        finally:
            chunks.put(_END)

    gevent.spawn(produce)
    finished = False
    try:
        while True:
            try:
                chunk = chunks.get(timeout=interval)
            except Empty:
                yield KEEPALIVE
                continue
            if chunk is _END:
                finished = True
                return
            yield chunk
    finally:
        if not finished and on_abandon is not None:
            on_abandon()
