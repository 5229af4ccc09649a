"""Server-sent events: JSON events, `data: [DONE]`, and errors after the headers."""

from __future__ import annotations

import json
from typing import Any, Iterator

from .errors import to_api_error

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode("utf-8") + b"\n\n"


def sse_stream(events: Iterator[dict[str, Any]], on_close=None) -> Iterator[bytes]:
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
