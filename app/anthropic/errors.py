"""Anthropic's error envelope: {"type": "error", "error": {"type": ..., "message": ...}}.

Every error on the Messages routes takes it, wherever it was raised (app/http/errors.py picks
the envelope by path), and so does an error after a stream started (an `error` event).
"""

from __future__ import annotations

from typing import Any

from app.http.errors import APIError, error_type, to_api_error
from app.http.sse import Named

# Where Anthropic's error types differ from the core's (the SDK picks its exception class by status).
TYPES = {
    503: "overloaded_error",  # the queue wait ran out, or the model is still loading
    504: "timeout_error",
    529: "overloaded_error",
}


def envelope(err: APIError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(err.status, TYPES, server="api_error"),
                                       "message": err.message}}


def error_event(ex: Exception) -> Named:
    """An error once the stream has begun: Anthropic's `error` event."""
    return Named("error", envelope(to_api_error(ex)))
