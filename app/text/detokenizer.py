"""Streaming token ids -> text, never emitting a partial UTF-8 character."""

from __future__ import annotations

import codecs
from typing import Protocol


class _TokenSource(Protocol):
    def token_bytes(self, token_id: int) -> bytes: ...
    def is_special(self, token_id: int) -> bool: ...


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas.

    Bytes of a character split across tokens are held back until complete; a
    sequence that can never become valid UTF-8 turns into U+FFFD immediately.
    """

    def __init__(self, tokenizer: _TokenSource, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parts: list[str] = []

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text."""
        if self._skip_special and self._tokenizer.is_special(token_id):
            return ""
        return self._emit(self._decoder.decode(self._tokenizer.token_bytes(token_id)))

    def flush(self) -> str:
        """End of stream: left-over incomplete bytes become U+FFFD."""
        return self._emit(self._decoder.decode(b"", final=True))

    def _emit(self, s: str) -> str:
        if s:
            self._parts.append(s)
        return s
