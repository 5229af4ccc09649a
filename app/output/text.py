"""The pipeline's first stage: token events to text deltas (incremental detokenizing, then
stop strings). Knows nothing of HTTP or any API's shapes."""

from __future__ import annotations

from typing import Iterator

from app.engine import Generation, PromptProgress, TokenEvent
from app.text.detokenizer import IncrementalDetokenizer
from app.text.stop import IndentStop, StopMatcher
from app.text.tokenizer import Tokenizer


class TextStream:
    """Iterate for text deltas; afterwards `finish_reason`, `stop_sequence` and `stats` say how it ended."""

    def __init__(self, generation: Generation, tokenizer: Tokenizer, stops: tuple[str, ...] = (), n_indent: int = 0):
        self.generation = generation
        self.stats = generation.stats
        self._detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=True)
        self._stops = StopMatcher(list(stops))
        self._indent = IndentStop(n_indent)  # fill in the middle: the end of the cursor's block
        self.finish_reason: str | None = None
        self.events: list[TokenEvent] = []  # every token generated, in order

    @property
    def indent_stopped(self) -> bool:
        """The text ended at a line indented less than n_indent."""
        return self._indent.stopped

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the text (None when it ended otherwise)."""
        return self._stops.matched

    def __iter__(self) -> Iterator[str | PromptProgress]:
        """Text deltas; PromptProgress events (if the request asked for them) pass through as they come."""
        try:
            for event in self.generation:
                if isinstance(event, PromptProgress):
                    yield event
                    continue
                self.events.append(event)
                text, stopped = self._cut(*self._stops.push(self._detok.push(event.token_id)))
                if text:
                    yield text
                if stopped:  # a stop string (or the infill's indentation) ended it: decoding stops here
                    self.finish_reason = "stop"
                    if self.stats.finish_reason is None:
                        self.stats.finish_reason = "stop"  # the access log's finish=, not "error"
                    return
            tail, stopped = self._stops.push(self._detok.flush())
            if not stopped:
                tail += self._stops.flush()
                stopped = self._stops.stopped  # a stop inside a longer one completes only here
            tail, stopped = self._cut(tail, stopped)
            if not stopped:
                tail += self._indent.flush()
            if tail:
                yield tail
            self.finish_reason = "stop" if stopped else self.stats.finish_reason
        finally:
            self.generation.close()  # stops decoding at once if we left early

    def _cut(self, text: str, stopped: bool) -> tuple[str, bool]:
        """Text the stop strings let through, cut where the indentation leaves the block."""
        text, left = self._indent.push(text)
        return text, stopped or left

    def text(self) -> str:
        """Run to the end and return the whole text."""
        return "".join(t for t in self if isinstance(t, str))
