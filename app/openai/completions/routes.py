"""HTTP for (legacy) text completions."""

from __future__ import annotations

from app.http.cancel import editor_key
from app.http.generation_resource import GenerationResource

from ..errors import error_event
from .protocol import parse_completion_request
from .serving import Completions


def completions_resource(service: Completions, max_body_bytes: int, *,
                         sse_keepalive: float = 0.0) -> GenerationResource:
    # fill in the middle (a `suffix`) is an editor's: its next one supersedes the one in flight
    return GenerationResource(parse_completion_request, service, max_body_bytes, sse_keepalive=sse_keepalive,
                              error_event=error_event,
                              supersede=lambda req, request: editor_key(req) if request.suffix is not None else None)
