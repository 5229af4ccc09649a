"""What one choice's output pipeline yields, in order: typed pieces of the answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from app.engine import PromptProgress
from app.tools import ContentDelta, ToolArgumentsDelta, ToolCallStart


@dataclass(frozen=True)
class ReasoningDelta:
    """Text of the model's reasoning (`<think>…</think>`), never part of the answer."""

    text: str


# PromptProgress (how far the prompt has been read) comes only to a request that asked for it
# (GenerationRequest.report_progress), before any text.
Delta = Union[PromptProgress, ReasoningDelta, ContentDelta, ToolCallStart, ToolArgumentsDelta]

__all__ = ["ContentDelta", "Delta", "PromptProgress", "ReasoningDelta", "ToolArgumentsDelta", "ToolCallStart"]
