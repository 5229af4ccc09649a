"""OpenAI's logprobs shape: one entry per generated token, with its alternatives."""

from __future__ import annotations

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
