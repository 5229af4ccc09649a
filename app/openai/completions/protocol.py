"""The (legacy) text completion request: parsed and validated, nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from app.http.errors import APIError, invalid_value
from app.http.fields import Fields
from app.http.generation_params import GenerationParams, parse_generation_params
from app.http.sessions import parse_session_id

from ..chat.protocol import MAX_CHOICES
from ..stream_options import parse_stream

MAX_PROMPTS = 8
MAX_LOGPROBS = 5  # OpenAI's limit for this route
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this route

# A prompt is either text or token ids.
Prompt = Union[str, list[int]]


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompts: list[Prompt]  # n choices each, in this order
    params: GenerationParams  # max_tokens None: DEFAULT_MAX_TOKENS, cut to the room the prompt leaves
    stream: bool
    include_usage: bool
    echo: bool
    session_id: str | None = None  # body `session_id`, else a session header (app/http/sessions.py)
    n: int = 1  # choices per prompt
    logprobs: int | None = None  # legacy logprobs: report this many alternatives (0-5) per token
    return_progress: bool = False  # llama.cpp's: stream prompt_progress chunks while the prompt is read
    suffix: str | None = None  # fill in the middle: the text after the completion (each prompt is the text before)


def parse_completion_request(body: Any) -> CompletionRequest:
    f = Fields.of(body)
    model = f.string("model", None)
    prompts = _prompts(f.raw("prompt"))
    params = parse_generation_params(f)
    stream, include_usage = parse_stream(f)
    echo = f.boolean("echo", False)
    return_progress = f.boolean("return_progress", False) and stream  # llama.cpp: only streams report it
    session_id = parse_session_id(f.raw("session_id"))
    n = f.integer("n", 1, lo=1, hi=MAX_CHOICES)
    best_of = f.integer("best_of", 1, lo=1)
    if best_of != 1:
        raise invalid_value("best_of", "only best_of=1 is supported")
    suffix = f.string("suffix", None)
    if suffix is not None and echo:
        raise invalid_value("echo", "'echo' cannot be combined with 'suffix' (fill in the middle)")
    logprobs = f.integer("logprobs", None, lo=0, hi=MAX_LOGPROBS)
    if echo and logprobs is not None:
        # OpenAI then reports the prompt's tokens' logprobs too; our runtime keeps only the last position's logits
        raise invalid_value("echo", "'echo' with 'logprobs' is not supported: the prompt's logprobs are not computed")
    f.raw("user")
    f.reject_unknown()
    return CompletionRequest(model=model, prompts=prompts, params=params, stream=stream,
                             include_usage=include_usage, echo=echo, session_id=session_id, n=n,
                             logprobs=logprobs, suffix=suffix, return_progress=return_progress)


def _is_token(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _prompts(value: Any) -> list[Prompt]:
    """A string, a list of strings, a list of token ids, or a list of token-id lists."""
    if value is None:
        raise APIError(400, "'prompt' is required", code="missing_required_parameter", param="prompt")
    if isinstance(value, str):
        prompts: list[Prompt] = [value]
    elif isinstance(value, list) and value and all(_is_token(x) for x in value):
        prompts = [value]
    elif isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        prompts = list(value)
    elif isinstance(value, list) and value and all(
            isinstance(x, list) and x and all(_is_token(t) for t in x) for x in value):
        prompts = list(value)
    else:
        raise invalid_value("prompt", "'prompt' must be a string, an array of strings, an array of token ids, "
                                      "or an array of non-empty arrays of token ids")
    if len(prompts) > MAX_PROMPTS:
        raise invalid_value("prompt", f"'prompt' takes at most {MAX_PROMPTS} prompts")
    for i, p in enumerate(prompts):
        if p == "":
            where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
            raise invalid_value("prompt", f"'{where}' is empty")
    return prompts
