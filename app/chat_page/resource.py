"""Serves the chat page: rendered once from its Jinja2 template, open without an API key.

The page holds no data; it asks for the key (kept in the browser's localStorage)
and sends it with every API call. A strict Content-Security-Policy lets it load
nothing but itself and talk to nothing but this server.
"""

from __future__ import annotations

from pathlib import Path

import falcon
import jinja2

TEMPLATES = Path(__file__).resolve().parent / "templates"

HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                               "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def render_page(api_key_required: bool) -> bytes:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    config = {"apiKeyRequired": api_key_required}
    return env.get_template("chat.html").render(config=config).encode("utf-8")


class ChatPageResource:
    def __init__(self, api_key_required: bool):
        self.page = render_page(api_key_required)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_HTML
        resp.set_headers(HEADERS)
        resp.data = self.page

