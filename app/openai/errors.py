"""OpenAI's error shape: {"error": {"message", "type", "param", "code"}}, as a response body and
as the event an error sends once a chat or completions stream has begun. The error type itself
is the core's (app/http/errors.py)."""

from __future__ import annotations

from typing import Any

from app.http.errors import APIError, error_type, to_api_error


def envelope(err: APIError) -> dict[str, Any]:
    return {"error": {"message": err.message, "type": err.type or error_type(err.status), "param": err.param,
                      "code": err.code}}


def error_event(ex: Exception) -> dict[str, Any]:
    """An error once the stream has begun: the envelope as one more `data:` event."""
    return envelope(to_api_error(ex))
