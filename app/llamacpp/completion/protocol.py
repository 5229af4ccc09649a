"""The /completion request (llama.cpp's shape): parsed and validated, nothing else.

`prompt` is, as in llama.cpp: a string; an array of token ids; a mixed array of strings and
token ids (one prompt, the strings tokenized where they stand); or an array of those (several
prompts, answered with an array). Multimodal prompt objects are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from app.http.errors import invalid_value
from app.http.fields import Fields

from ..params import LlamaParams, parse_llama_params

MAX_PROMPTS = 64
Piece = Union[str, int]


@dataclass(frozen=True)
class CompletionRequest:
    llama: LlamaParams
    prompts: tuple[tuple[Piece, ...], ...]  # each prompt: its strings and token ids, in order
    stream: bool = False
    session_id: str | None = None


def parse_completion_request(body: Any) -> CompletionRequest:
    f = Fields(dict(Fields.of(body).body))
    llama = parse_llama_params(f)
    prompts = _prompts(f.raw("prompt"))
    f.reject_unknown()
    return CompletionRequest(llama=llama, prompts=prompts, stream=llama.stream, session_id=llama.session_id)


def _is_token(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _prompts(value: Any) -> tuple[tuple[Piece, ...], ...]:
    if value is None:
        raise invalid_value("prompt", "'prompt' is required")
    if isinstance(value, str):
        return ((value,),)
    if not isinstance(value, list) or not value:
        raise invalid_value("prompt", "'prompt' must be a string, an array of token ids, or an array of prompts")
    if any(_is_token(x) for x in value) and all(_is_token(x) or isinstance(x, str) for x in value):
        return (_pieces(value, "prompt"),)  # one prompt of token ids (and strings)
    if len(value) > MAX_PROMPTS:
        raise invalid_value("prompt", f"'prompt' takes at most {MAX_PROMPTS} prompts")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            out.append((item,))
        elif isinstance(item, list) and item:
            out.append(_pieces(item, f"prompt[{i}]"))
        elif isinstance(item, dict):
            raise invalid_value(f"prompt[{i}]", "multimodal prompts are not supported: this model reads text only")
        else:
            raise invalid_value(f"prompt[{i}]", f"'prompt[{i}]' must be a string or a non-empty array of token ids")
    return tuple(out)


def _pieces(items: list[Any], param: str) -> tuple[Piece, ...]:
    for x in items:
        if not (_is_token(x) or isinstance(x, str)):
            raise invalid_value(param, f"'{param}' must hold only token ids and strings")
    return tuple(items)
