"""The chat completion's response shapes: whole responses, stream chunks and their deltas.

Builders only: no generation logic. `serving.py` decides what to say; this says it the
way OpenAI's chat.completion / chat.completion.chunk objects do.
"""

from __future__ import annotations

from typing import Any

from app.output import ChoiceOutput, ContentDelta, Delta, ReasoningDelta, ToolArgumentsDelta, ToolCallStart
from app.tools import ToolCall


def tool_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def message(output: ChoiceOutput) -> dict[str, Any]:
    """The assistant message of a whole choice."""
    out: dict[str, Any] = {"role": "assistant", "content": output.content}
    if output.reasoning:
        out["reasoning_content"] = output.reasoning
    if output.tool_calls:
        out["content"] = output.content or None
        out["tool_calls"] = [tool_call(c) for c in output.tool_calls]
    return out


def choice(index: int, output: ChoiceOutput, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "message": message(output), "logprobs": logprobs,
            "finish_reason": output.finish_reason}


def completion(id: str, created: int, model: str, choices: list[dict[str, Any]], usage: dict[str, Any],
               timings: dict[str, Any]) -> dict[str, Any]:
    return {"id": id, "object": "chat.completion", "created": created, "model": model, "choices": choices,
            "usage": usage, "timings": timings}


def delta(d: Delta) -> dict[str, Any]:
    """A pipeline delta as an OpenAI chat delta."""
    if isinstance(d, ReasoningDelta):
        return {"reasoning_content": d.text}
    if isinstance(d, ContentDelta):
        return {"content": d.text}
    if isinstance(d, ToolCallStart):
        return {"tool_calls": [{"index": d.index, "id": d.id, "type": "function",
                                "function": {"name": d.name, "arguments": ""}}]}
    if isinstance(d, ToolArgumentsDelta):
        return {"tool_calls": [{"index": d.index, "function": {"arguments": d.fragment}}]}
    raise TypeError(f"not a chat delta: {d!r}")


def chunk(id: str, created: int, model: str, choice: dict[str, Any] | None, *,
          include_usage: bool) -> dict[str, Any]:
    """A chat.completion.chunk with one choice's delta (or none: the usage chunk)."""
    out = {"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
           "choices": [] if choice is None else [choice]}
    if include_usage:
        out["usage"] = None
    return out


def stream_choice(index: int, delta: dict[str, Any], logprobs: dict[str, Any] | None = None,
                  finish_reason: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
