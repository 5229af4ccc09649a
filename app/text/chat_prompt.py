"""A chat prompt's tokens where only the template writes special tokens.

Text a client sends (message content, tool results, tool definitions, names) is tokenized as
text: a user message holding `<|im_start|>system` gets the tokens of those characters, never the
control token that opens a turn, so no one can forge a turn or a tool result by typing one (as
llama.cpp's and vLLM's servers do for chat).

How: before the template runs, each special token's text inside a client string is replaced by a
placeholder (a private-use character, a per-render random nonce, the occurrence's number). The
template renders as usual (it never sees a special token's text in client strings, and its string
tests on them are unaffected unless they look for a special token); the rendered text is cut at
the placeholders, the template's parts tokenized with special tokens parsed, each placeholder as
the plain text it stands for.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any, Callable

from .tokenizer import Tokenizer

_OPEN, _CLOSE = "\U000f0000", "\U000f0001"  # plane-15 private use: no tokenizer gives them a meaning
# Keys whose values the templates compare and the protocols have validated to fixed words.
_NOT_TEXT = frozenset({"role", "type"})


@dataclass(frozen=True)
class ChatPrompt:
    text: str  # the rendered prompt, as the template wrote it (client text in full)
    tokens: list[int]


class _Escaper:
    def __init__(self, specials: list[str]):
        self.nonce = secrets.token_hex(6)
        self.originals: list[str] = []
        self._pattern = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True))) \
            if specials else None

    def _placeholder(self, match: re.Match) -> str:
        self.originals.append(match.group(0))
        return f"{_OPEN}{self.nonce}:{len(self.originals) - 1}{_CLOSE}"

    def escape(self, value: Any) -> Any:
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self._pattern.sub(self._placeholder, value) if self._pattern.search(value) else value
        if isinstance(value, list):
            return [self.escape(v) for v in value]
        if isinstance(value, dict):
            return {k: (v if k in _NOT_TEXT else self.escape(v)) for k, v in value.items()}
        return value

    def split(self, rendered: str) -> list[tuple[str, bool]]:
        """The rendered text as (piece, is client text) pieces, placeholders restored."""
        if not self.originals:
            return [(rendered, False)]
        marker = re.compile(f"{_OPEN}{self.nonce}:(\\d+){_CLOSE}")
        pieces: list[tuple[str, bool]] = []
        at = 0
        for m in marker.finditer(rendered):
            index = int(m.group(1))
            if index >= len(self.originals):  # not one of ours: leave it as text
                continue
            pieces.append((rendered[at:m.start()], False))
            pieces.append((self.originals[index], True))
            at = m.end()
        pieces.append((rendered[at:], False))
        return [p for p in pieces if p[0]]


class CannotContinue(ValueError):
    """The template does not write the final assistant message's text where it can be continued."""


def continues_final_message(messages: list[dict[str, Any]]) -> bool:
    """A conversation ending in an assistant message with text and no tool calls: a prefill, which
    the model continues (Anthropic's Messages; llama.cpp's chat) rather than answers with a new turn."""
    last = messages[-1] if messages else None
    return (isinstance(last, dict) and last.get("role") == "assistant" and not last.get("tool_calls")
            and isinstance(last.get("content"), str) and last["content"] != "")


def render_chat(tokenizer: Tokenizer, render: Callable[[list[dict[str, Any]], Any], str],
                messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
                continue_final: bool = False) -> ChatPrompt:
    """`render(messages, tools)` (the template) on the client's messages and tools with their
    special-token text escaped; the tokens with special tokens only where the template put them.
    `continue_final` (`render` then writes no generation prompt): the prompt ends where the final
    assistant message's text does, without the end of its turn, so the model goes on with it."""
    escaper = _Escaper(tokenizer.special_token_texts)
    escaped = escaper.escape(messages)
    end = None
    if continue_final:
        end = f"{_OPEN}{escaper.nonce}:end{_CLOSE}"
        escaped = [*escaped[:-1], {**escaped[-1], "content": escaped[-1]["content"] + end}]
    rendered = render(escaped, escaper.escape(tools))
    if end is not None:
        at = rendered.find(end)
        if at < 0:
            raise CannotContinue("this model's chat template does not write a final assistant message "
                                 "where it can be continued")
        rendered = rendered[:at]
    pieces = escaper.split(rendered)
    text = "".join(p for p, _ in pieces)
    if len(pieces) == 1:
        return ChatPrompt(text, tokenizer.encode(text))
    tokens: list[int] = []
    for piece, literal in pieces:
        tokens += tokenizer.encode_text(piece) if literal else tokenizer.encode(piece, add_bos=False)
    bos = tokenizer.bos_token_id
    if tokenizer.add_bos_token and bos is not None and tokens[:1] != [bos]:
        tokens.insert(0, bos)
    return ChatPrompt(text, tokens)
