"""Splitting a reasoning model's ``<think>…</think>`` out of its answer, incrementally.

A reasoning model writes ``<think>`` reasoning ``</think>`` and then its answer;
some chat templates already open ``<think>`` in the generation prompt, so the
output starts inside the reasoning. `ReasoningSplitter` takes the text as it is
generated, in pieces cut anywhere (a tag may straddle two pieces), and returns
what is reasoning and what is content so far, never letting a tag, or the start
of one, into either. Only a ``<think>`` that opens the output (after whitespace)
starts reasoning; later tags are ordinary content.

Whitespace around the reasoning (the newlines after ``<think>``, before and after
``</think>``) belongs to neither part, so the streamed pieces join to the same
text as a whole output split at once. Output that ends inside the reasoning
(max_tokens, a stop string) is all reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"


@dataclass(frozen=True)
class Split:
    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """Feed output text with `push`, then call `flush` once at the end."""

    def __init__(self, *, started: bool = False, open_tag: str = OPEN_TAG, close_tag: str = CLOSE_TAG):
        self._open, self._close = open_tag, close_tag
        # start: nothing decided yet; reasoning: inside it; after: just closed it; content: the answer
        self._state = "reasoning" if started else "start"
        self._held = ""  # text not given out yet: maybe a tag's start, or whitespace that may be dropped
        self._reasoning_out = False  # some reasoning was given out (later whitespace is kept)
        self.had_reasoning = started  # the output opened (or the prompt had opened) a reasoning block

    @property
    def in_reasoning(self) -> bool:
        """The text so far ends inside an open reasoning block (what is held back counts)."""
        return self._state == "reasoning"

    def push(self, text: str) -> Split:
        self._held += text
        reasoning, content = [], []
        while True:
            if self._state == "start":
                rest = self._held.lstrip()
                if rest.startswith(self._open):
                    self._state, self._held, self.had_reasoning = "reasoning", rest[len(self._open):], True
                    continue
                if self._open.startswith(rest):  # only whitespace, or the tag's start: wait
                    break
                self._state = "content"
                continue
            if self._state == "reasoning":
                end = self._held.find(self._close)
                if end >= 0:
                    reasoning.append(self._reasoning_piece(self._held[:end].rstrip()))
                    self._state, self._held = "after", self._held[end + len(self._close):]
                    continue
                keep = len(self._held) - _partial_suffix(self._held, self._close)
                keep = len(self._held[:keep].rstrip())
                reasoning.append(self._reasoning_piece(self._held[:keep]))
                self._held = self._held[keep:]
                break
            if self._state == "after":
                self._held = self._held.lstrip()
                if not self._held:
                    break
                self._state = "content"
                continue
            content.append(self._held)  # content: everything passes
            self._held = ""
            break
        return Split("".join(reasoning), "".join(content))

    def flush(self) -> Split:
        """What is still held: an undecided start is content, an unclosed reasoning's end is reasoning."""
        held, self._held = self._held, ""
        if self._state == "start":
            return Split(content=held)
        if self._state == "reasoning":
            return Split(reasoning=self._reasoning_piece(held.rstrip()))
        return Split()

    def _reasoning_piece(self, text: str) -> str:
        if not self._reasoning_out:
            text = text.lstrip()
            self._reasoning_out = bool(text)
        return text


def split_reasoning(text: str, *, started: bool = False) -> Split:
    """A whole output at once: the same parts as pushing it piece by piece."""
    splitter = ReasoningSplitter(started=started)
    a, b = splitter.push(text), splitter.flush()
    return Split(a.reasoning + b.reasoning, a.content + b.content)


def prompt_opens_reasoning(prompt: str, open_tag: str = OPEN_TAG) -> bool:
    """True when the rendered prompt ends inside an opened reasoning block (the template wrote
    ``<think>`` for the model), so its output starts as reasoning."""
    return prompt.rstrip().endswith(open_tag)


def template_reasons(template_source: str | None, vocab_has_tag: bool = False) -> bool:
    """Whether to look for reasoning in a model's output: its chat template mentions the
    think tags, or its vocabulary has ``<think>`` as a token."""
    source = template_source or ""
    return vocab_has_tag or OPEN_TAG in source or CLOSE_TAG in source
