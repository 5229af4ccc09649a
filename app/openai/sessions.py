"""Sessions: the `session_id` of a generating request, and the /v1/sessions routes.

A session id names a conversation whose KV state the engine saves when another
conversation takes the cache, and restores when the conversation continues
(app/engine/sessions.py). The id comes from the body's `session_id` or, when
the body has none, from the first of the headers in SESSION_HEADERS.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import falcon

from app.engine.sessions import MAX_SESSION_ID_CHARS

if TYPE_CHECKING:
    from app.model_host import ServedModel

from .errors import APIError, invalid_value

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
    """The parsed request, with the session id of the headers if its body named none."""
    if not hasattr(request, "session_id") or request.session_id is not None:
        return request
    session_id = session_from_headers(req)
    return request if session_id is None else dataclasses.replace(request, session_id=session_id)


class SessionsResource:
    """GET /v1/sessions lists the saved sessions; DELETE /v1/sessions/{id} drops one."""

    def __init__(self, model: ServedModel):
        self.model = model

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        report = self.model.engine.sessions_report()
        resp.media = {
            "object": "list",
            "data": [{"object": "session", **e} for e in report["entries"]],
            "enabled": report["enabled"],
            "disabled_reason": report["disabled_reason"],
            "max_bytes": report["max_bytes"],
            "used_bytes": report["used_bytes"],
        }

    def on_delete_one(self, req: falcon.Request, resp: falcon.Response, session_id: str) -> None:
        parse_session_id(session_id, "session_id")
        if not self.model.engine.drop_session(session_id):
            raise APIError(404, f"no session '{session_id}'", code="session_not_found", param="session_id")
        resp.media = {"id": session_id, "object": "session", "deleted": True}
