"""HTTP for chat completions: body in, JSON or SSE out."""

from __future__ import annotations

import falcon

from app.engine import CancelToken

from ..body import read_json
from ..cancel import cancel_token_for
from ..sse import HEADERS, sse_stream
from .protocol import parse_chat_request
from .serving import ChatCompletions


class ChatCompletionsResource:
    def __init__(self, service: ChatCompletions, max_body_bytes: int):
        self.service = service
        self.max_body_bytes = max_body_bytes

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        request = parse_chat_request(read_json(req, self.max_body_bytes))
        prepared = self.service.prepare(request)
        cancel: CancelToken = cancel_token_for(req)
        if request.stream:
            resp.content_type = "text/event-stream"
            resp.set_headers(HEADERS)
            resp.stream = sse_stream(self.service.stream(prepared, cancel), on_close=cancel.close)
            return
        try:
            resp.media = self.service.complete(prepared, cancel)
        finally:
            cancel.close()
