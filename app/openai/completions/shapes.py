"""The text completion's response shapes (OpenAI's text_completion object, whole or a stream chunk)."""

from __future__ import annotations

from typing import Any


def choice(index: int, text: str, logprobs: dict[str, Any] | None, finish_reason: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def completion(id: str, created: int, model: str, choices: list[dict[str, Any]], usage: dict[str, Any],
               timings: dict[str, Any]) -> dict[str, Any]:
    return {"id": id, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "usage": usage, "timings": timings}


def chunk(id: str, created: int, model: str, choice: dict[str, Any] | None, *, include_usage: bool) -> dict[str, Any]:
    """A streamed text_completion: one choice's text (or none: the usage chunk)."""
    out = {"id": id, "object": "text_completion", "created": created, "model": model,
           "choices": [] if choice is None else [choice]}
    if include_usage:
        out["usage"] = None
    return out
