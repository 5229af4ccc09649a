"""The HTTP shape every generating route shares: JSON body in; JSON, or SSE when `stream` is set, out."""

from __future__ import annotations

from typing import Any, Callable

import falcon

from .body import read_json
from .cancel import cancel_token_for
from .errors import ACCESS_LOG_KEY
from .sessions import with_header_session
from .sse import HEADERS, Event, sse_stream


def generation_log(generations) -> str:
    """Tokens and timings of a request's generations, summed, for its access log line."""
    if not generations:
        return "-"
    finish = ",".join(sorted({g.finish_reason or "error" for g in generations}))
    total = lambda name: sum(getattr(g, name) for g in generations)  # noqa: E731
    return (f"prompt={total('prompt_tokens')} cached={total('cached_tokens')} "
            f"completion={total('completion_tokens')} finish={finish} queued={total('queued_ms'):.0f}ms "
            f"prefill={total('prompt_ms'):.0f}ms decode={total('decode_ms'):.0f}ms")


class GenerationResource:
    """`parse` validates the body; `service` has prepare(request), complete(...) and stream(...).

    `error_event` and `done` shape the stream's end in the route's API: an error after the start
    in the API's own shape; `data: [DONE]` last, or not.
    """

    def __init__(self, parse: Callable[[Any], Any], service, max_body_bytes: int, *,
                 error_event: Callable[[Exception], Event], sse_keepalive: float = 0.0, done: bool = True,
                 supersede: Callable[[falcon.Request, Any], str | None] | None = None):
        self.parse = parse
        self.service = service
        self.max_body_bytes = max_body_bytes
        self.sse_keepalive = sse_keepalive  # seconds of silence before a `: keep-alive` comment; 0: none
        self.error_event = error_event
        self.done = done
        self.supersede = supersede  # (req, request) -> a key: a newer request with it cancels this one

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        request = with_header_session(self.parse(read_json(req, self.max_body_bytes)), req)
        prepared = self.service.prepare(request)  # every request error is raised here, before output
        cancel = cancel_token_for(req, self.supersede(req, request) if self.supersede else None)

        def finished() -> None:  # before gunicorn writes the access line
            cancel.close()
            req.env[ACCESS_LOG_KEY] = generation_log(cancel.generations)

        if request.stream:
            resp.content_type = "text/event-stream; charset=utf-8"  # (SSE is UTF-8; naive clients need telling)
            resp.set_headers(HEADERS)
            beat = getattr(self.service, "keepalive_event", None)  # an API's own keep-alive event, if it has one
            resp.stream = sse_stream(self.service.stream(prepared, cancel), keepalive=self.sse_keepalive,
                                     on_abandon=lambda: cancel.cancel("client disconnected"),
                                     on_close=finished, error_event=self.error_event, done=self.done,
                                     keepalive_event=beat(prepared) if beat is not None else None)
            return
        try:
            resp.media = self.service.complete(prepared, cancel)
        finally:
            finished()
