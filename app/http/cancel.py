"""A request's cancel token, watching the client's socket where the server exposes it."""

from __future__ import annotations

import falcon

from app.engine import CancelToken
from app.engine.cancel import SocketClosedProbe


def cancel_token_for(req: falcon.Request, supersede_key: str | None = None) -> CancelToken:
    sock = req.env.get("gunicorn.socket") or req.env.get("gunicorn.sock")
    try:
        probe = SocketClosedProbe(sock.fileno()) if sock is not None else None
    except (OSError, AttributeError):
        probe = None
    return CancelToken(probe, supersede_key)


def editor_key(req: falcon.Request, request=None) -> str:
    """The supersede key of an editor's completion request (/infill, or /v1/completions with a
    `suffix`): one per client, so its next completion cancels the one in flight. The client is
    its address (the first X-Forwarded-For hop behind a proxy), its credentials and its
    User-Agent; the key never leaves the process."""
    forwarded = (req.get_header("X-Forwarded-For") or "").split(",")[0].strip()
    credentials = req.get_header("Authorization") or req.get_header("X-Api-Key") or ""
    return "editor\0" + "\0".join((forwarded or req.remote_addr or "", credentials, req.user_agent or ""))
