"""Anthropic's error envelope: {"type": "error", "error": {"type": ..., "message": ...}}.

Every error on the Messages routes takes it, wherever it was raised (app/openai/errors.py
picks the envelope by path), and so does an error after a stream started (an `error` event).
"""

from __future__ import annotations

from typing import Any

from app.openai.errors import APIError, to_api_error
from app.openai.sse import Named

# HTTP status -> Anthropic's error type (the SDK picks its exception class by status).
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",  # the queue wait ran out, or the model is still loading
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    return TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def envelope(err: APIError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(err.status), "message": err.message}}


def error_event(ex: Exception) -> Named:
    """An error once the stream has begun: Anthropic's `error` event."""
    return Named("error", envelope(to_api_error(ex)))
