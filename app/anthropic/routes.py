"""HTTP for the Messages API: POST /v1/messages (also `?beta=true`, as Claude Code sends it)
and POST /v1/messages/count_tokens, with Anthropic's error envelope on every path under them."""

from __future__ import annotations

import falcon

from app.admission import Offload
from app.http.body import read_json
from app.http.errors import Envelope
from app.http.generation_resource import GenerationResource

from .errors import envelope, error_event
from .protocol import parse_count_tokens_request, parse_messages_request
from .serving import Messages

PATHS = ("/v1/messages", "/messages")  # the /v1 route and its unprefixed alias


def error_envelopes() -> dict[str, Envelope]:
    """Path prefix -> envelope, for app.http.errors.install."""
    return {path: envelope for path in PATHS}


def messages_resource(service: Messages, max_body_bytes: int, *, sse_keepalive: float = 0.0) -> GenerationResource:
    return GenerationResource(parse_messages_request, service, max_body_bytes, sse_keepalive=sse_keepalive,
                              error_event=error_event, done=False)


class CountTokensResource:
    """Rendering and tokenizing a body of up to --max-body-bytes takes a while: done off the event
    loop, two at a time (app/admission.py), a third gets a 429."""

    def __init__(self, service: Messages, max_body_bytes: int):
        self.service = service
        self.max_body_bytes = max_body_bytes
        self.offload = Offload("count_tokens")

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        request = parse_count_tokens_request(read_json(req, self.max_body_bytes))
        resp.media = self.offload.run(self.service.count_tokens, request)


def add_routes(app: falcon.App, service: Messages, max_body_bytes: int, *, sse_keepalive: float = 0.0) -> None:
    messages = messages_resource(service, max_body_bytes, sse_keepalive=sse_keepalive)
    count_tokens = CountTokensResource(service, max_body_bytes)
    for path in PATHS:
        app.add_route(path, messages)
        app.add_route(f"{path}/count_tokens", count_tokens)
