"""OpenAI's usage object."""

from __future__ import annotations

from typing import Any

from app.engine import GenerationStats


def usage(*stats: GenerationStats, shared_prompt: bool = False) -> dict[str, Any]:
    """OpenAI's usage object over one or more generations; with `shared_prompt` (n choices
    of one prompt) the prompt counts once."""
    counted = stats[:1] if shared_prompt else stats
    prompt = sum(s.prompt_tokens for s in counted)
    completion = sum(s.completion_tokens for s in stats)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(s.cached_tokens for s in counted)},
    }
