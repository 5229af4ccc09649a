"""One choice's output, from token events to typed deltas, shared by every API.

    token events → detokenizer → stop strings   (text.TextStream)
                 → reasoning split              (app.text.reasoning)
                 → tool-call parser             (app.tools)
                 → typed deltas                 (deltas.py)

`ChoicePipeline` yields the deltas as they are decided; `ChoicePipeline.run()` is the
fold of that stream, so a whole response always equals its streamed form. Each API
(OpenAI chat and completions, the Responses and Messages APIs) turns the same deltas
into its own shapes; none of them re-implements a stage.
"""

from .deltas import ContentDelta, Delta, PromptProgress, ReasoningDelta, ToolArgumentsDelta, ToolCallStart
from .pipeline import ChoiceOutput, ChoicePipeline, OutputOptions
from .text import TextStream

__all__ = [
    "ChoiceOutput", "ChoicePipeline", "ContentDelta", "Delta", "OutputOptions", "PromptProgress", "ReasoningDelta",
    "TextStream", "ToolArgumentsDelta", "ToolCallStart",
]
