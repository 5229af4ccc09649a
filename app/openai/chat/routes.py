"""HTTP for chat completions."""

from __future__ import annotations

from app.http.generation_resource import GenerationResource

from ..errors import error_event
from .protocol import parse_chat_request
from .serving import ChatCompletions


def chat_completions_resource(service: ChatCompletions, max_body_bytes: int, *,
                              sse_keepalive: float = 0.0) -> GenerationResource:
    return GenerationResource(parse_chat_request, service, max_body_bytes, sse_keepalive=sse_keepalive,
                              error_event=error_event)
