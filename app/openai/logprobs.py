"""OpenAI's logprobs shape: one entry per generated token, with its alternatives."""

from __future__ import annotations

import codecs
from typing import Any, Iterable

from app.engine import TokenEvent
from app.text.tokenizer import Tokenizer


def _entry(tokenizer: Tokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    raw = tokenizer.token_bytes(token_id)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def logprobs_content(tokenizer: Tokenizer, events: Iterable[TokenEvent], skip: frozenset[int]) -> list[dict[str, Any]]:
    """`choices[].logprobs.content` for `events`; end-of-turn tokens (`skip`) are not content."""
    out = []
    for e in events:
        if e.token_id in skip:
            continue
        item = _entry(tokenizer, e.token_id, e.logprob)
        item["top_logprobs"] = [_entry(tokenizer, t, lp) for t, lp in e.top]
        out.append(item)
    return out


class LegacyLogprobs:
    """Legacy completions' `choices[].logprobs`: {tokens, token_logprobs, top_logprobs, text_offset}.

    Call `take` with successive events (a whole choice, or a stream chunk's share); offsets
    run on across calls: each token's is the length of the text before it in the choice.
    `top_logprobs` maps the `k` most likely tokens, and always the chosen one, to their logprobs.
    """

    def __init__(self, tokenizer: Tokenizer, skip: frozenset[int], k: int):
        self._tokenizer, self._skip, self._k = tokenizer, skip, k
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span tokens
        self._offset = 0

    def _token(self, token_id: int) -> tuple[str, bytes]:
        raw = self._tokenizer.token_bytes(token_id)
        return raw.decode("utf-8", errors="replace"), raw

    def take(self, events: Iterable[TokenEvent]) -> dict[str, Any]:
        out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in events:
            if e.token_id in self._skip:
                continue
            token, raw = self._token(e.token_id)
            top = {self._token(t)[0]: lp for t, lp in e.top[: self._k]}
            top.setdefault(token, e.logprob)
            out["tokens"].append(token)
            out["token_logprobs"].append(e.logprob)
            out["top_logprobs"].append(top)
            out["text_offset"].append(self._offset)
            if not self._tokenizer.is_special(e.token_id):  # special tokens are not in the text
                self._offset += len(self._utf8.decode(raw))
        return out
