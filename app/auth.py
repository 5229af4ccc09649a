"""API-key check: `Authorization: Bearer KEY` or `X-Api-Key: KEY`, compared in constant time.

Off unless a key is configured; /health stays open for probes, and the app may open
more paths (the chat page, which holds no data; /metrics when `metrics_auth` is "open").
"""

from __future__ import annotations

import hashlib
import hmac

import falcon

from app.http.errors import APIError

OPEN_PATHS = frozenset({"/health"})


def client_id(key: bytes) -> str:
    """A client's name on this box: derived from its key, and no way back to it."""
    return hashlib.sha256(b"etserve-client:" + key).hexdigest()[:16]


class RequireApiKey:
    """`api_key` holds one key, or several separated by commas: each key is one client, and a client
    sees only the stored responses and sessions it created (req.context.client names it)."""

    def __init__(self, api_key: str, open_paths: frozenset[str] = OPEN_PATHS):
        self._keys = [k.strip().encode("utf-8") for k in api_key.split(",") if k.strip()]
        self._open = OPEN_PATHS | open_paths

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.path in self._open or req.method == "OPTIONS":
            return
        given = req.get_header("X-Api-Key") or ""
        auth = req.get_header("Authorization") or ""
        if not given and auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        presented = given.encode("utf-8")
        # every key compared, in constant time each: which one matched takes no longer to learn
        matched = [k for k in self._keys if hmac.compare_digest(presented, k)] if given else []
        if matched:
            req.context.client = client_id(matched[0])
        if not matched:
            raise APIError(401, "a valid API key is required: send `Authorization: Bearer <key>` "
                           "or `x-api-key: <key>`", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
