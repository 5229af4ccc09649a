"""The Responses API's shapes: the response object, its output items, usage, stream events.

Builders only: no generation logic. serving.py decides what to say; this says it the
way OpenAI's `response` object and its typed stream events do (the openai SDK's
openai/types/responses/ is the reference for every field).
"""

from __future__ import annotations

from typing import Any

from app.engine import GenerationStats


def response(*, id: str, created_at: int, model: str, status: str, output: list[dict[str, Any]],
             request, usage: dict[str, Any] | None, previous_response_id: str | None,
             incomplete_reason: str | None = None, error: dict[str, Any] | None = None,
             completed_at: int | None = None) -> dict[str, Any]:
    return {
        "id": id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "completed_at": completed_at,
        "error": error,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": request.instructions,
        "max_output_tokens": request.params.max_tokens,
        "model": model,
        "output": output,
        "output_text": output_text(output),
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": previous_response_id,
        "prompt_cache_key": request.prompt_cache_key,
        "reasoning": {"effort": (request.reasoning or {}).get("effort"),
                      "summary": (request.reasoning or {}).get("summary")},
        "service_tier": "default",
        "store": request.store,
        "temperature": request.params.sampling.temperature,
        "text": request.text,
        "tool_choice": request.echo_tool_choice,
        "tools": request.echo_tools,
        "top_logprobs": request.top_logprobs,
        "top_p": request.params.sampling.top_p,
        "truncation": request.truncation,
        "usage": usage,
        "user": request.user,
        "metadata": request.metadata,
    }


def output_text(output: list[dict[str, Any]]) -> str:
    """All output_text parts of the output's messages, joined (the SDK's `output_text`)."""
    return "".join(part["text"] for item in output if item["type"] == "message"
                   for part in item["content"] if part["type"] == "output_text")


def usage(stats: GenerationStats, reasoning_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": stats.prompt_tokens,
        # what the prompt read from the KV cache, and what it wrote there (the rest of it)
        "input_tokens_details": {"cached_tokens": stats.cached_tokens,
                                 "cache_write_tokens": stats.prompt_tokens - stats.cached_tokens},
        "output_tokens": stats.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
    }


def error(code: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message}


# ---- output items ----------------------------------------------------------------------------

def text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": list(logprobs or [])}


def message_item(id: str, status: str, text: str | None) -> dict[str, Any]:
    """An assistant message; `text` None: its content part is not open yet."""
    return {"id": id, "type": "message", "role": "assistant", "status": status,
            "content": [] if text is None else [text_part(text)]}


def summary_part(text: str) -> dict[str, Any]:
    return {"type": "summary_text", "text": text}


def reasoning_item(id: str, status: str, text: str | None) -> dict[str, Any]:
    return {"id": id, "type": "reasoning", "status": status,
            "summary": [] if text is None else [summary_part(text)]}


def function_call_item(id: str, status: str, call_id: str, name: str, arguments: str, *,
                       namespace: str | None = None) -> dict[str, Any]:
    """A function call; one of a `namespace` tool's functions carries its namespace (as Codex reads it)."""
    item = {"id": id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}
    if namespace is not None:
        item["namespace"] = namespace
    return item


def custom_tool_call_item(id: str, status: str, call_id: str, name: str, input: str) -> dict[str, Any]:
    return {"id": id, "type": "custom_tool_call", "status": status, "call_id": call_id, "name": name, "input": input}


# ---- stream events (the serving numbers them: `sequence_number`) -----------------------------

def lifecycle(kind: str, resp: dict[str, Any]) -> dict[str, Any]:
    """response.created / in_progress / completed / incomplete / failed."""
    return {"type": f"response.{kind}", "response": resp}


def item_added(output_index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.added", "output_index": output_index, "item": item}


def item_done(output_index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.done", "output_index": output_index, "item": item}


def content_part(kind: str, item_id: str, output_index: int, text: str,
                 logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """response.content_part.added / done (the message's one output_text part)."""
    return {"type": f"response.content_part.{kind}", "item_id": item_id, "output_index": output_index,
            "content_index": 0, "part": text_part(text, logprobs)}


def text_delta(item_id: str, output_index: int, delta: str,
               logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """`logprobs`: the tokens whose text this delta first carries (include message.output_text.logprobs)."""
    return {"type": "response.output_text.delta", "item_id": item_id, "output_index": output_index,
            "content_index": 0, "delta": delta, "logprobs": list(logprobs or [])}


def text_done(item_id: str, output_index: int, text: str,
              logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "response.output_text.done", "item_id": item_id, "output_index": output_index,
            "content_index": 0, "text": text, "logprobs": list(logprobs or [])}


def summary_part_event(kind: str, item_id: str, output_index: int, text: str) -> dict[str, Any]:
    """response.reasoning_summary_part.added / done."""
    return {"type": f"response.reasoning_summary_part.{kind}", "item_id": item_id,
            "output_index": output_index, "summary_index": 0, "part": summary_part(text)}


def summary_delta(item_id: str, output_index: int, delta: str) -> dict[str, Any]:
    return {"type": "response.reasoning_summary_text.delta", "item_id": item_id, "output_index": output_index,
            "summary_index": 0, "delta": delta}


def summary_done(item_id: str, output_index: int, text: str) -> dict[str, Any]:
    return {"type": "response.reasoning_summary_text.done", "item_id": item_id, "output_index": output_index,
            "summary_index": 0, "text": text}


def arguments_delta(item_id: str, output_index: int, delta: str) -> dict[str, Any]:
    return {"type": "response.function_call_arguments.delta", "item_id": item_id, "output_index": output_index,
            "delta": delta}


def arguments_done(item_id: str, output_index: int, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "response.function_call_arguments.done", "item_id": item_id, "output_index": output_index,
            "name": name, "arguments": arguments}


def custom_input_delta(item_id: str, output_index: int, delta: str) -> dict[str, Any]:
    return {"type": "response.custom_tool_call_input.delta", "item_id": item_id, "output_index": output_index,
            "delta": delta}


def custom_input_done(item_id: str, output_index: int, input: str) -> dict[str, Any]:
    return {"type": "response.custom_tool_call_input.done", "item_id": item_id, "output_index": output_index,
            "input": input}


def error_event(code: str | None, message: str, param: str | None) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message, "param": param}


def deleted(id: str) -> dict[str, Any]:
    return {"id": id, "object": "response", "deleted": True}
