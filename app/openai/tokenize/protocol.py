"""Tokenize, detokenize and apply-template requests: parsed and validated, nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.http.errors import APIError, invalid_value
from app.http.fields import Fields

MAX_TOKENS_IN = 1 << 20


@dataclass(frozen=True)
class TokenizeRequest:
    model: str | None
    text: str
    add_special: bool  # add what the tokenizer adds around a text on its own (a BOS, for some models)
    vllm: bool  # asked as vLLM does ("prompt"): answer with count and max_model_len too
    parse_special: bool = True  # llama.cpp's: special tokens written in the text are their ids
    with_pieces: bool = False  # llama.cpp's: each token as {"id", "piece"}


@dataclass(frozen=True)
class DetokenizeRequest:
    model: str | None
    tokens: list[int]


def parse_tokenize_request(body: Any) -> TokenizeRequest:
    """llama.cpp: {"content", "add_special"=false, "parse_special"=true, "with_pieces"=false};
    vLLM: {"prompt", "add_special_tokens"=true}."""
    f = Fields.of(body)
    model = f.string("model", None)
    content = f.string("content", None)
    prompt = f.string("prompt", None)
    if content is not None and prompt is not None:
        raise invalid_value("prompt", "send either 'content' or 'prompt', not both")
    if content is None and prompt is None:
        raise APIError(400, "'content' is required", code="missing_required_parameter", param="content")
    vllm = content is None
    add_special = f.boolean("add_special", False)
    add_special_tokens = f.boolean("add_special_tokens", True)
    if "add_special" not in body and "add_special_tokens" in body:
        add_special = add_special_tokens
    elif "add_special" not in body:
        add_special = vllm  # each server's own default
    parse_special = f.boolean("parse_special", True)
    with_pieces = f.boolean("with_pieces", False)
    f.reject_unknown()
    return TokenizeRequest(model=model, text=content if content is not None else prompt, add_special=add_special,
                           vllm=vllm, parse_special=parse_special, with_pieces=with_pieces)


def parse_detokenize_request(body: Any) -> DetokenizeRequest:
    f = Fields.of(body)
    model = f.string("model", None)
    tokens = f.array("tokens")
    if tokens is None:
        raise APIError(400, "'tokens' is required", code="missing_required_parameter", param="tokens")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise invalid_value("tokens", "'tokens' must be an array of token ids")
    if len(tokens) > MAX_TOKENS_IN:
        raise invalid_value("tokens", f"'tokens' holds at most {MAX_TOKENS_IN} ids")
    f.reject_unknown()
    return DetokenizeRequest(model=model, tokens=tokens)
