"""The Messages API's response shapes: the message, its content blocks, its stream events.

Builders only: serving.py decides what to say; this says it the way Anthropic's Message and
RawMessageStreamEvent objects do.
"""

from __future__ import annotations

from typing import Any

from app.http.sse import Named


def usage(input_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, Any]:
    """Anthropic counts the prompt tokens read from the cache apart from the others
    (input_tokens + cache_read_input_tokens is the whole prompt)."""
    return {"input_tokens": input_tokens - cached_tokens, "output_tokens": output_tokens,
            "cache_read_input_tokens": cached_tokens, "cache_creation_input_tokens": 0}


def message(id: str, model: str, content: list[dict[str, Any]], stop_reason: str | None,
            stop_sequence: str | None, usage: dict[str, Any]) -> dict[str, Any]:
    return {"id": id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}


def text_block(text: str = "") -> dict[str, Any]:
    return {"type": "text", "text": text}


def thinking_block(thinking: str = "") -> dict[str, Any]:
    return {"type": "thinking", "thinking": thinking, "signature": ""}


def tool_use_block(id: str, name: str, input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": name, "input": input}


def text_delta(text: str) -> dict[str, Any]:
    return {"type": "text_delta", "text": text}


def thinking_delta(thinking: str) -> dict[str, Any]:
    return {"type": "thinking_delta", "thinking": thinking}


def signature_delta(signature: str) -> dict[str, Any]:
    return {"type": "signature_delta", "signature": signature}


def input_json_delta(partial_json: str) -> dict[str, Any]:
    return {"type": "input_json_delta", "partial_json": partial_json}


def message_start(message: dict[str, Any]) -> Named:
    return Named("message_start", {"type": "message_start", "message": message})


def ping() -> Named:
    return Named("ping", {"type": "ping"})


def content_block_start(index: int, block: dict[str, Any]) -> Named:
    return Named("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})


def content_block_delta(index: int, delta: dict[str, Any]) -> Named:
    return Named("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def content_block_stop(index: int) -> Named:
    return Named("content_block_stop", {"type": "content_block_stop", "index": index})


def message_delta(stop_reason: str | None, stop_sequence: str | None, usage: dict[str, Any]) -> Named:
    return Named("message_delta", {"type": "message_delta",
                                   "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                   "usage": usage})


def message_stop() -> Named:
    return Named("message_stop", {"type": "message_stop"})


def token_count(input_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens}
