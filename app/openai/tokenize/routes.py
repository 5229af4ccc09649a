"""HTTP for POST /tokenize, /detokenize and /apply-template (each also under /v1)."""

from __future__ import annotations

import falcon

from app.http.body import read_json

from ..chat.protocol import parse_chat_request
from .protocol import parse_detokenize_request, parse_tokenize_request
from .serving import Tokenization


class TokenizerResource:
    """One resource, three routes: add it with suffix "tokenize", "detokenize" and "apply_template"."""

    def __init__(self, service: Tokenization, max_body_bytes: int):
        self.service = service
        self.max_body_bytes = max_body_bytes

    def on_post_tokenize(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = self.service.tokenize(parse_tokenize_request(read_json(req, self.max_body_bytes)))

    def on_post_detokenize(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = self.service.detokenize(parse_detokenize_request(read_json(req, self.max_body_bytes)))

    def on_post_apply_template(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = self.service.apply_template(parse_chat_request(read_json(req, self.max_body_bytes)))
