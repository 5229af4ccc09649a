"""Sessions: the `session_id` of a generating request, and its client's scope.

A session id names a conversation whose KV state the engine saves when another
conversation takes the cache, and restores when the conversation continues
(app/engine/sessions.py). The id comes from the body's `session_id` or, when
the body has none, from the first of the headers in SESSION_HEADERS. The /v1/sessions routes
are app/openai/sessions.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import falcon

from app.engine.sessions import MAX_SESSION_ID_CHARS

from .errors import invalid_value

SESSION_HEADERS = ("X-Session-ID", "X-ExecuTorch-Session-ID", "x-session-affinity")


def parse_session_id(value: Any, param: str = "session_id") -> str | None:
    """None when absent; else a string of 1 to 128 characters, or a 400 naming `param`."""
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_SESSION_ID_CHARS:
        raise invalid_value(param, f"'{param}' must be a string of 1 to {MAX_SESSION_ID_CHARS} characters")
    return value


def session_from_headers(req: falcon.Request) -> str | None:
    for name in SESSION_HEADERS:
        value = req.get_header(name)
        if value is not None:
            return parse_session_id(value, name)
    return None


def with_header_session(request, req: falcon.Request):
    """The parsed request, with the session id of the headers if its body named none, and both
    it and the request's owner scoped to the client that sent it (see `scoped`)."""
    if not hasattr(request, "session_id"):
        return request
    session_id = request.session_id if request.session_id is not None else session_from_headers(req)
    client = client_of(req)
    changes: dict[str, Any] = {"session_id": scoped(session_id, client)}
    if hasattr(request, "owner"):
        changes["owner"] = client
    return dataclasses.replace(request, **changes)


# Between a client's name and its session id in the engine's id of the session.
CLIENT_SEPARATOR = "~"


def client_of(req: falcon.Request) -> str | None:
    """The client a request comes from (app/auth.py names it by its API key); None without keys."""
    return req.context.get("client")


def scoped(session_id: str | None, client: str | None) -> str | None:
    """The engine's id of a client's session: with API keys, each client's sessions are its own
    (another client naming the same id gets another session, and never sees this one)."""
    if session_id is None or client is None:
        return session_id
    return f"{client}{CLIENT_SEPARATOR}{session_id}"


def unscoped(engine_id: str, client: str | None) -> str | None:
    """A session id as its client knows it; None for another client's session."""
    if client is None:
        return engine_id
    prefix = client + CLIENT_SEPARATOR
    return engine_id[len(prefix):] if engine_id.startswith(prefix) else None
