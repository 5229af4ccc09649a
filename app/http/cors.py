"""Which web pages may call this server from a browser (CORS), and answering their preflights.

A browser chat UI on another origin can only read our answers if they carry
`Access-Control-Allow-Origin`, and sends an OPTIONS preflight before any request with an
`Authorization` or JSON body. Granting every origin (llama.cpp's and vLLM's default) would let any
web page a LAN user visits drive a keyless server and read what it says; granting none (what
etserve did) leaves browser UIs out. So, as Ollama does:

- with an API key configured, any origin: the key is the gate, and a page can only send it if the
  user gave it one;
- without, this server's own pages (the chat page: the Origin's host is the request's Host),
  pages served from this machine (localhost, 127.0.0.1, [::1], 0.0.0.0 on any port), desktop and
  editor apps' schemes (app, file, tauri, vscode-webview, vscode-file), and the patterns of
  `--cors-origins` (`*` in a pattern matches anything; `*` alone allows every origin).

A request whose Origin is not allowed is refused with a 403 before anything runs, in its route's
error shape: a browser would hide the answer from such a page, but would still have sent it
(a form-encoded or text/plain POST needs no preflight), and the generation would have run.
Clients that are not browsers send no Origin and are not affected.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import falcon

from app.http.errors import APIError

LOCAL_ORIGINS = tuple(f"{scheme}://{host}{port}" for scheme in ("http", "https")
                      for host in ("localhost", "127.0.0.1", "[::1]", "0.0.0.0") for port in ("", ":*")) + (
    "app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*")

ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
# what a page's script may read of our answers besides the safelisted headers
EXPOSE_HEADERS = "X-Request-Id, Request-Id, Retry-After, WWW-Authenticate"
MAX_AGE = "600"


def patterns(setting: str) -> tuple[str, ...]:
    return tuple(p.strip().rstrip("/").lower() for p in setting.split(",") if p.strip())


def matcher(globs: tuple[str, ...]) -> re.Pattern:
    """One regex for origin patterns whose only wildcard is `*` (no fnmatch: `[::1]` is literal)."""
    return re.compile("|".join(".*".join(re.escape(part) for part in g.split("*")) for g in globs))


class Cors:
    """Falcon middleware, before the API key check: refuses requests from origins not allowed,
    answers allowed preflights (204), and marks allowed origins' answers readable."""

    def __init__(self, cors_origins: str = "", any_origin: bool = False):
        extra = patterns(cors_origins)
        self._any = any_origin or "*" in extra
        self._patterns = matcher(LOCAL_ORIGINS + extra)

    def allows(self, origin: str, host: str | None, forwarded_host: str | None = None) -> bool:
        if self._any:
            return True
        origin = origin.strip().rstrip("/").lower()
        if self._patterns.fullmatch(origin):
            return True
        return same_origin(origin, host) or same_origin(origin, forwarded_host)

    def _allowed(self, req: falcon.Request) -> bool:
        return self.allows(req.get_header("Origin") or "", req.get_header("Host"), req.get_header("X-Forwarded-Host"))

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        origin = req.get_header("Origin")
        if origin is None:
            return
        req.context.cors_allowed = self._allowed(req)  # (process_response reads the verdict)
        if not req.context.cors_allowed:
            raise APIError(403, f"this server does not take requests from web pages at {origin}: start it with "
                           "--cors-origins naming that origin (or '*' for any), or set an API key",
                           code="origin_not_allowed")
        if req.method == "OPTIONS" and req.get_header("Access-Control-Request-Method"):
            resp.status = falcon.HTTP_204
            resp.set_header("Access-Control-Allow-Methods", ALLOW_METHODS)
            asked = req.get_header("Access-Control-Request-Headers")
            if asked:
                resp.set_header("Access-Control-Allow-Headers", asked)
            resp.set_header("Access-Control-Max-Age", MAX_AGE)
            resp.complete = True  # no key check, no route: a preflight carries no credentials

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource, req_succeeded: bool) -> None:
        origin = req.get_header("Origin")
        if origin is None or not getattr(req.context, "cors_allowed", False):
            return
        resp.set_header("Access-Control-Allow-Origin", origin)
        resp.set_header("Access-Control-Expose-Headers", EXPOSE_HEADERS)
        resp.append_header("Vary", "Origin")


def same_origin(origin: str, host: str | None) -> bool:
    """Whether a page at `origin` was served by the host the request names (its Host header, or
    nginx's X-Forwarded-Host): the same host and port, or the same host where the header gives no
    port (nginx's `$host`)."""
    if not host:
        return False
    try:
        o, h = urlsplit(origin), urlsplit("//" + host.strip().lower())
        o_port, h_port = o.port, h.port  # ValueError for a port that is not one
    except ValueError:
        return False
    if not o.hostname or o.hostname != h.hostname:
        return False
    return h_port is None or o_port == h_port or (o_port is None and h_port == {"http": 80, "https": 443}.get(o.scheme))
