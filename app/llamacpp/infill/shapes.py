"""The /infill response shapes, as llama.cpp's /completion writes them (whole, or a stream chunk)."""

from __future__ import annotations

from typing import Any

from app.engine import GenerationStats

# our finish reason -> llama.cpp's stop_type
_STOP_TYPE = {"stop": "eos", "length": "limit", "cancelled": "none"}


def stop_type(finish_reason: str | None, stop_sequence: str | None, indent_stopped: bool = False) -> str:
    """llama.cpp's stop_type; its n_indent end is a "limit" there too."""
    if indent_stopped:
        return "limit"
    return "word" if stop_sequence else _STOP_TYPE.get(finish_reason or "", "none")


def chunk(content: str) -> dict[str, Any]:
    return {"index": 0, "content": content, "tokens": [], "stop": False}


def final(model: str, content: str, stats: GenerationStats, stop: str, stop_sequence: str | None,
          timings: dict[str, Any]) -> dict[str, Any]:
    """The whole response, or (with the content already streamed, content "") the stream's last chunk."""
    return {
        "index": 0,
        "content": content,
        "tokens": [],
        "stop": True,
        "model": model,
        "tokens_predicted": stats.completion_tokens,
        "tokens_evaluated": stats.prompt_tokens,
        "tokens_cached": stats.cached_tokens,
        "truncated": False,
        "stop_type": stop,
        "stopping_word": stop_sequence or "",
        "has_new_line": "\n" in content,
        "timings": timings,
    }
