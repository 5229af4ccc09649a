"""The HTTP shape every generating route shares: JSON body in; JSON, or SSE when `stream` is set, out."""

from __future__ import annotations

from typing import Any, Callable

import falcon

from .body import read_json
from .cancel import cancel_token_for
from .sse import HEADERS, sse_stream


class GenerationResource:
    """`parse` validates the body; `service` has prepare(request), complete(...) and stream(...)."""

    def __init__(self, parse: Callable[[Any], Any], service, max_body_bytes: int):
        self.parse = parse
        self.service = service
        self.max_body_bytes = max_body_bytes

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        request = self.parse(read_json(req, self.max_body_bytes))
        prepared = self.service.prepare(request)  # every request error is raised here, before output
        cancel = cancel_token_for(req)
        if request.stream:
            resp.content_type = "text/event-stream"
            resp.set_headers(HEADERS)
            resp.stream = sse_stream(self.service.stream(prepared, cancel), on_close=cancel.close)
            return
        try:
            resp.media = self.service.complete(prepared, cancel)
        finally:
            cancel.close()
