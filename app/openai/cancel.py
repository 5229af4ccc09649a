"""A request's cancel token, watching the client's socket where the server exposes it."""

from __future__ import annotations

import falcon

from app.engine import CancelToken
from app.engine.cancel import SocketClosedProbe


def cancel_token_for(req: falcon.Request) -> CancelToken:
    sock = req.env.get("gunicorn.socket") or req.env.get("gunicorn.sock")
    try:
        probe = SocketClosedProbe(sock.fileno()) if sock is not None else None
    except (OSError, AttributeError):
        probe = None
    return CancelToken(probe)
