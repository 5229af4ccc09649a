"""Grammars compiled over the served model's tokenizer, with llguidance.

llguidance (Microsoft's engine behind Guidance, also used by llama.cpp and vLLM)
turns a Lark grammar with embedded JSON schemas into a token mask per step in
about a millisecond, lazily, without precomputing a state machine over the
vocabulary: far beyond what a hand-written matcher would do well.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Iterable

from llguidance import LLMatcher, LLTokenizer


class GrammarError(ValueError):
    """A grammar (or a schema inside it) that cannot be enforced."""


class TokenMatcher:
    """One generation's position in a grammar: which tokens may come next."""

    def __init__(self, matcher: LLMatcher):
        self._m = matcher

    def allowed(self) -> bytes:
        """The next-token bitmask: bit i of little-endian 32-bit word i // 32 allows token i."""
        mask = self._m.compute_bitmask()
        if self._m.is_error():
            raise GrammarError(self._m.get_error())
        return mask

    def accept(self, token_id: int) -> None:
        if not self._m.consume_token(token_id):
            raise GrammarError(self._m.get_error() or f"token {token_id} does not fit the grammar")

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens`, in order, the grammar would take from here (nothing consumed)."""
        return self._m.validate_tokens(tokens) if tokens else 0

    def forced(self) -> list[int]:
        """The tokens the grammar forces from here (a schema's fixed keys and punctuation)."""
        return list(self._m.compute_ff_tokens())

    @property
    def done(self) -> bool:
        """The grammar is complete: only an end-of-turn token may follow."""
        return self._m.is_stopped()


class Grammar:
    """A validated grammar; each generation takes its own matcher."""

    def __init__(self, tokenizer: LLTokenizer, source: str):
        self._tokenizer = tokenizer
        self._source = source

    def matcher(self) -> TokenMatcher:
        m = LLMatcher(self._tokenizer, self._source, log_level=0)
        if m.is_error():
            raise GrammarError(m.get_error())
        return TokenMatcher(m)


class GrammarCompiler:
    """The tokenizer side of llguidance for one model (building it takes ~0.5-1.5 s)."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: Iterable[int]):
        eos = sorted(set(eos_ids))
        self._tokenizer = LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos)
        self._added = {t["content"]: t["id"] for t in json.loads(tokenizer_json).get("added_tokens", [])}
        # Grammars already validated, by their Lark text: an agent sends the same tools with every
        # request (Claude Code's dozen take ~12 ms to compile, on the greenlet that serves everyone).
        self._validated = functools.lru_cache(maxsize=self.CACHED)(self._validate)

    CACHED = 32  # grammars kept (a tool list's Lark text is tens of kB)

    def literal(self, text: str) -> str:
        """`text` as a Lark terminal. A tokenizer's added token (Qwen's `<tool_call>`) is matched
        as that token, the way the model writes it: llguidance reads added tokens by id, not text."""
        if text in self._added:
            return f"<[{self._added[text]}]>"
        return json.dumps(text)

    def token_id(self, text: str) -> int | None:
        """The id of the added token spelled `text`, if the tokenizer has one."""
        return self._added.get(text)

    @classmethod
    def from_file(cls, path: str | Path, vocab_size: int, eos_ids: Iterable[int]) -> GrammarCompiler:
        return cls(Path(path).read_text(encoding="utf-8"), vocab_size, eos_ids)

    def compile(self, lark: str) -> Grammar:
        """Validate a Lark grammar; a schema feature llguidance would not enforce is an error
        too (its warnings name what it would ignore), never a silent fallback. The last CACHED
        results (errors too) are kept: the same text compiles once."""
        done = self._validated(lark)
        if isinstance(done, GrammarError):
            raise GrammarError(*done.args)
        return done

    def _validate(self, lark: str) -> Grammar | GrammarError:
        try:
            source = LLMatcher.grammar_from_lark(lark)
        except ValueError as e:  # llguidance's own parse errors
            return GrammarError(str(e))
        is_error, messages = LLMatcher.validate_grammar_with_warnings(source, self._tokenizer)
        if is_error or messages:
            return GrammarError("; ".join(messages) or "invalid grammar")
        return Grammar(self._tokenizer, source)
