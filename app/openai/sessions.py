"""The /v1/sessions routes: the saved sessions (app/engine/sessions.py) a client may list and drop.
A generating request's `session_id` is read in app/http/sessions.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

import falcon

from app.http.errors import APIError
from app.http.sessions import client_of, parse_session_id, scoped, unscoped

if TYPE_CHECKING:
    from app.model_host import ServedModel


class SessionsResource:
    """GET /v1/sessions lists the saved sessions; DELETE /v1/sessions/{id} drops one."""

    def __init__(self, model: ServedModel):
        self.model = model

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        report = self.model.engine.sessions_report()
        client = client_of(req)
        mine = [{**e, "id": unscoped(e["id"], client)} for e in report["entries"]]
        resp.media = {
            "object": "list",
            "data": [{"object": "session", **e} for e in mine if e["id"] is not None],
            "enabled": report["enabled"],
            "disabled_reason": report["disabled_reason"],
            "max_bytes": report["max_bytes"],
            "used_bytes": report["used_bytes"],
        }

    def on_delete_one(self, req: falcon.Request, resp: falcon.Response, session_id: str) -> None:
        parse_session_id(session_id, "session_id")
        if not self.model.engine.drop_session(scoped(session_id, client_of(req))):
            raise APIError(404, f"no session '{session_id}'", code="session_not_found", param="session_id")
        resp.media = {"id": session_id, "object": "session", "deleted": True}
