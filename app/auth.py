"""API-key check: `Authorization: Bearer KEY` or `X-Api-Key: KEY`, compared in constant time.

Off unless a key is configured; /health stays open for probes, and the app may open
more paths (the chat page, which holds no data; /metrics when `metrics_auth` is "open").
"""

from __future__ import annotations

import hmac

import falcon

from app.openai.errors import APIError

OPEN_PATHS = frozenset({"/health"})


class RequireApiKey:
    def __init__(self, api_key: str, open_paths: frozenset[str] = OPEN_PATHS):
        self._key = api_key.encode("utf-8")
        self._open = OPEN_PATHS | open_paths

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.path in self._open or req.method == "OPTIONS":
            return
        given = req.get_header("X-Api-Key") or ""
        auth = req.get_header("Authorization") or ""
        if not given and auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        if not given or not hmac.compare_digest(given.encode("utf-8"), self._key):
            raise APIError(401, "a valid API key is required: send `Authorization: Bearer <key>` "
                           "or `x-api-key: <key>`", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
