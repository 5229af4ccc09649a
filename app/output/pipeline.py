"""One choice: token events → text → reasoning split → tool calls → typed deltas.

`ChoicePipeline` is the only place these stages are chained. Iterate it for deltas as
they are decided (streaming), or call `run()` for the whole output, which is the fold
of the same iteration, so the two can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from app.engine import Generation, GenerationStats, TokenEvent
from app.text.reasoning import ReasoningSplitter, Split
from app.text.tokenizer import Tokenizer
from app.tools import StreamingToolParser, ToolCall

from .deltas import ContentDelta, Delta, PromptProgress, ReasoningDelta, ToolArgumentsDelta, ToolCallStart
from .text import TextStream


@dataclass(frozen=True)
class OutputOptions:
    """How one choice's text is read, from the request and the model."""

    stops: tuple[str, ...] = ()
    # None: the output is not split; else <think>…</think> is split out of it, starting inside
    # the reasoning when True (the template's generation prompt opened it)
    reasoning_started: bool | None = None
    tools: list[dict[str, Any]] | None = None  # OpenAI function tools whose calls are parsed out
    parallel_tool_calls: bool = True
    n_indent: int = 0  # fill in the middle: end before a line indented less (llama.cpp's n_indent)


@dataclass
class ChoiceOutput:
    """The whole output of one choice: the fold of its deltas, and how it ended."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None  # "stop", "length", "tool_calls" or "cancelled"
    stop_sequence: str | None = None  # the stop string that ended it, if one did
    stats: GenerationStats = field(default_factory=GenerationStats)
    events: list[TokenEvent] = field(default_factory=list)

    def add(self, delta: Delta) -> None:
        if isinstance(delta, PromptProgress):
            return  # how the prompt was read is not part of the output
        if isinstance(delta, ReasoningDelta):
            self.reasoning += delta.text
        elif isinstance(delta, ContentDelta):
            self.content += delta.text
        elif isinstance(delta, ToolCallStart):
            self.tool_calls.append(ToolCall(delta.id, delta.name, ""))
        elif isinstance(delta, ToolArgumentsDelta):
            call = self.tool_calls[delta.index]
            self.tool_calls[delta.index] = ToolCall(call.id, call.name, call.arguments + delta.fragment)


class ChoicePipeline:
    """Iterate for deltas; afterwards `finish_reason`, `stop_sequence`, `stats` and `events` are final.

    `events` grows as tokens arrive, so a streaming caller can attach each token's
    logprobs to the delta that first follows it.
    """

    def __init__(self, generation: Generation, tokenizer: Tokenizer, options: OutputOptions = OutputOptions()):
        self._text = TextStream(generation, tokenizer, options.stops, options.n_indent)
        self._splitter = None if options.reasoning_started is None \
            else ReasoningSplitter(started=options.reasoning_started)
        self._parser = StreamingToolParser(options.tools, parallel=options.parallel_tool_calls) \
            if options.tools else None

    @property
    def stats(self) -> GenerationStats:
        return self._text.stats

    @property
    def events(self) -> list[TokenEvent]:
        return self._text.events

    @property
    def stop_sequence(self) -> str | None:
        return self._text.stop_sequence

    @property
    def indent_stopped(self) -> bool:
        return self._text.indent_stopped

    @property
    def finish_reason(self) -> str | None:
        """"tool_calls" when the output held calls, else how the text ended."""
        if self._parser is not None and self._parser.has_tool_calls and self._text.finish_reason != "cancelled":
            return "tool_calls"
        return self._text.finish_reason

    @property
    def cancelled(self) -> bool:
        return self._text.finish_reason == "cancelled"

    @property
    def thinking(self) -> bool:
        """The output read so far is inside the model's reasoning: decided by the text, not by the
        deltas given out (the tool parser may hold an answer's text back for many tokens)."""
        return self._splitter is not None and self._splitter.in_reasoning

    def __iter__(self) -> Iterator[Delta]:
        for text in self._text:
            if isinstance(text, PromptProgress):
                yield text
                continue
            yield from self._split(self._splitter.push(text) if self._splitter else Split(content=text))
        if self.cancelled:  # nothing more is decided for an abandoned choice
            return
        if self._splitter is not None:
            yield from self._split(self._splitter.flush())
        if self._parser is not None:
            yield from _non_empty(self._parser.finish(cut=self._text.finish_reason == "length"))

    def _split(self, split: Split) -> Iterator[Delta]:
        """Reasoning first; the tool parser reads only the answer."""
        if split.reasoning:
            yield ReasoningDelta(split.reasoning)
        if not split.content:
            return
        if self._parser is None:
            yield ContentDelta(split.content)
        else:
            yield from _non_empty(self._parser.push(split.content))

    def run(self) -> ChoiceOutput:
        """Run to the end: the whole output, folded from the same deltas a stream sends."""
        out = ChoiceOutput()
        for delta in self:
            out.add(delta)
        out.finish_reason, out.stop_sequence = self.finish_reason, self.stop_sequence
        out.stats, out.events = self.stats, self.events
        return out


def _non_empty(deltas) -> Iterator[Delta]:
    return (d for d in deltas if not (isinstance(d, ContentDelta) and not d.text))
