"""Server-sent events: JSON events (named or not), `data: [DONE]`, errors after the headers, keep-alive comments.

OpenAI's chat and completions streams send bare `data:` lines and end with `data: [DONE]`;
the Responses and Messages APIs name each event (`event: response.created`) and send no
[DONE]. A service yields dicts, or `Named` events; `sse_stream` writes either, and an error
after the headers in the shape of the route's API (its `error_event`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Union

from app.engine.offload import gevent_active

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"  # an SSE comment: clients and the OpenAI SDK skip it
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True)
class Named:
    """An event with a name: written as `event: NAME` then its `data:` line."""

    name: str
    data: dict[str, Any]


Event = Union[dict[str, Any], Named]


# Characters JSON may carry raw that many SSE clients take for line ends: str.splitlines() does
# (requests' iter_lines(decode_unicode=True), Python SSE parsers built on it), and so do some
# JavaScript line readers. Escaped, the JSON means the same and every reader sees one line.
_LINE_BREAKERS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def event(payload: Event) -> bytes:
    if isinstance(payload, Named):
        return b"event: " + payload.name.encode() + b"\n" + event(payload.data)
    text = json.dumps(payload, ensure_ascii=False)
    if not text.isascii():
        text = text.translate(_LINE_BREAKERS)
    return b"data: " + text.encode("utf-8") + b"\n\n"


def sse_stream(events: Iterator[Event], *, error_event: Callable[[Exception], Event], keepalive: float = 0.0,
               on_abandon: Callable[[], None] | None = None,
               on_close: Callable[[], None] | None = None,
               done: bool = True, keepalive_event: Callable[[], Event] | None = None) -> Iterator[bytes]:
    """The response body for `events`: each as a `data:` line (after an `event:` line if it is
    `Named`), then `data: [DONE]` unless `done` is False.

    An exception once streaming has begun becomes the event `error_event` makes of it (the
    API's own error shape), and the stream ends.

    With `keepalive` (seconds, under gevent) a comment line goes out whenever
    no event came for that long, e.g. while the request waits for the model or
    its prompt is read. `on_abandon` runs when the server closes the body
    early (the client went away); `on_close` once `events` is finished. With `keepalive_event`
    the keep-alive is that event instead of a comment: some clients' idle timers count events
    only (Codex CLI's does: a stream of comments for 300 s is an "idle timeout waiting for SSE").
    """
    body = _encoded(events, on_close, error_event, done)
    if keepalive > 0 and gevent_active():
        beat = (lambda: event(keepalive_event())) if keepalive_event is not None else (lambda: KEEPALIVE)
        return _with_keepalive(body, keepalive, on_abandon, beat)
    return _closing(body, on_abandon)


def _encoded(events: Iterator[Event], on_close: Callable[[], None] | None,
             error_event: Callable[[Exception], Event], done: bool) -> Iterator[bytes]:
    """Encode events; an error once streaming has begun becomes an error event.

    Closing this generator (the server does when the client goes away) closes
    `events`, which stops generation at once.
    """
    try:
        for payload in events:
            yield event(payload)
    except Exception as e:  # headers are sent: the error becomes an event
        yield event(error_event(e))
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()
        if on_close is not None:
            on_close()
    if done:
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
PRODUCER_WAIT_S = 30.0  # longest an abandoned stream's close waits for its generation's last step


def _with_keepalive(body: Iterator[bytes], interval: float, on_abandon: Callable[[], None] | None,
                    beat: Callable[[], bytes] = lambda: KEEPALIVE) -> Iterator[bytes]:
    """`body` runs in its own greenlet and hands chunks over a queue; this side
    waits on the queue with a timeout and sends KEEPALIVE when it expires.

    The producer is never killed (it may be inside a native call in the thread
    pool): when the client leaves, `on_abandon` cancels the request, and the
    engine stops at its next token or prefill chunk, which ends the producer.
    The queue is unbounded, so a producer whose reader left never blocks.
    Closing this body waits for the producer to end (up to PRODUCER_WAIT_S):
    a closed body means its request no longer runs, which the router counts on
    before it frees a model.
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

    producer = gevent.spawn(produce)
    finished = False
    try:
        while True:
            try:
                chunk = chunks.get(timeout=interval)
            except Empty:
                yield beat()
                continue
            if chunk is _END:
                finished = True
                return
            yield chunk
    finally:
        if not finished:
            if on_abandon is not None:
                on_abandon()
            producer.join(timeout=PRODUCER_WAIT_S)
