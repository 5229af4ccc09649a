"""Text completions: prompts to tokens, n generations per prompt, the OpenAI response shapes."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Iterator

from app.engine import CancelToken, GenerationRequest
from app.model_host import ServedModel
from app.textgen import TextStream

from ..common import check_model, check_token_list, choice_generation, plan_generation, timings, usage, vocab_limit
from ..errors import invalid_value
from ..generation_params import check_token_ids
from ..logprobs import LegacyLogprobs
from .protocol import DEFAULT_MAX_TOKENS, CompletionRequest, Prompt


@dataclass(frozen=True)
class PreparedPrompt:
    generation: GenerationRequest
    echo: str  # the prompt's text, prepended to the choice when the request asks for echo


@dataclass(frozen=True)
class PreparedCompletion:
    request: CompletionRequest
    prompts: list[PreparedPrompt]
    id: str
    created: int


class Completions:
    def __init__(self, model: ServedModel):
        self.model = model

    def _tokens(self, prompt: Prompt, param: str) -> tuple[list[int], str]:
        tokenizer = self.model.tokenizer
        if isinstance(prompt, str):
            return tokenizer.encode(prompt), prompt
        check_token_list(prompt, vocab_limit(self.model), param)
        return list(prompt), tokenizer.decode(prompt)

    def prepare(self, request: CompletionRequest) -> PreparedCompletion:
        """Everything that can fail because of the request fails here, before any output."""
        check_model(self.model, request.model)
        self.model.engine.check_admission()
        check_token_ids(request.params, self.model.tokenizer.vocab_size)
        prepared = []
        for i, prompt in enumerate(request.prompts):
            param = "prompt" if len(request.prompts) == 1 else f"prompt[{i}]"
            tokens, text = self._tokens(prompt, param)
            if not tokens:
                raise invalid_value("prompt", f"'{param}' has no tokens")
            generation = plan_generation(self.model, tokens, request.params, param="prompt",
                                         default_max_tokens=DEFAULT_MAX_TOKENS, session_id=request.session_id)
            if request.logprobs:
                generation = replace(generation, top_logprobs=request.logprobs)
            prepared.append(PreparedPrompt(generation, text))
        return PreparedCompletion(request, prepared, f"cmpl-{uuid.uuid4().hex}", int(time.time()))

    def _choices(self, prepared: PreparedCompletion) -> Iterator[tuple[int, int, int]]:
        """(choice index, prompt index, choice of that prompt): n choices per prompt, prompt by prompt."""
        n = prepared.request.n
        for p in range(len(prepared.prompts)):
            for j in range(n):
                yield p * n + j, p, j

    def _text_stream(self, prepared: PreparedCompletion, prompt: PreparedPrompt, choice: int,
                     cancel: CancelToken) -> TextStream:
        generation = self.model.engine.generate(choice_generation(prompt.generation, choice), cancel)
        return TextStream(generation, self.model.tokenizer, prepared.request.params.stop)

    def _logprobs(self, prepared: PreparedCompletion) -> LegacyLogprobs | None:
        k = prepared.request.logprobs
        return None if k is None else LegacyLogprobs(self.model.tokenizer, self.model.stop_token_ids, k)

    def complete(self, prepared: PreparedCompletion, cancel: CancelToken) -> dict[str, Any]:
        """n generations per prompt, in order; usage counts each prompt once."""
        choices, stats = [], [[] for _ in prepared.prompts]
        for index, p, j in self._choices(prepared):
            prompt = prepared.prompts[p]
            stream = self._text_stream(prepared, prompt, j, cancel)
            text = stream.text()
            stats[p].append(stream.stats)
            logprobs = self._logprobs(prepared)
            choices.append({
                "index": index,
                "text": prompt.echo + text if prepared.request.echo else text,
                "logprobs": logprobs.take(stream.events) if logprobs else None,
                "finish_reason": stream.finish_reason,
            })
        return {
            "id": prepared.id,
            "object": "text_completion",
            "created": prepared.created,
            "model": self.model.id,
            "choices": choices,
            "usage": _usage(stats),
            "timings": timings(*(s for group in stats for s in group)),
        }

    def stream(self, prepared: PreparedCompletion, cancel: CancelToken) -> Iterator[dict[str, Any]]:
        """Per prompt in order: text chunks (the echo first), a finish chunk; then usage if asked."""
        include_usage = prepared.request.include_usage

        def chunk(index: int | None, text: str = "", finish: str | None = None,
                  logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
            out = {
                "id": prepared.id,
                "object": "text_completion",
                "created": prepared.created,
                "model": self.model.id,
                "choices": [] if index is None else [
                    {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
                ],
            }
            if include_usage:
                out["usage"] = None
            return out

        stats = [[] for _ in prepared.prompts]
        for index, p, j in self._choices(prepared):
            prompt = prepared.prompts[p]
            stream = self._text_stream(prepared, prompt, j, cancel)
            logprobs, reported = self._logprobs(prepared), 0  # events whose logprobs went out already

            def new_logprobs() -> dict[str, Any] | None:
                nonlocal reported
                if logprobs is None:
                    return None
                out, reported = logprobs.take(stream.events[reported:]), len(stream.events)
                return out

            if prepared.request.echo and prompt.echo:
                yield chunk(index, prompt.echo)
            for text in stream:
                yield chunk(index, text, logprobs=new_logprobs())
            if stream.finish_reason == "cancelled":
                return
            stats[p].append(stream.stats)
            # the finish chunk carries any tokens whose text never went out (held back by a stop string)
            yield chunk(index, "", stream.finish_reason, logprobs=new_logprobs())
        if include_usage:
            final = chunk(None)
            final["usage"] = _usage(stats)
            yield final


def _usage(groups) -> dict[str, Any]:
    """Usage over every prompt's choices: each prompt counts once, however many choices it had."""
    return _sum([usage(*group, shared_prompt=True) for group in groups if group])


def _sum(parts: list[Any]) -> Any:
    if isinstance(parts[0], dict):
        return {key: _sum([p[key] for p in parts]) for key in parts[0]}
    return sum(parts)
