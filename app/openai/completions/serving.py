"""Text completions: prompts to tokens, n generations per prompt, the OpenAI response shapes."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Iterator

from app.engine import CancelToken, GenerationRequest
from app.model_host import ServedModel
from app.output import ChoicePipeline, OutputOptions, PromptProgress
from app.http.errors import invalid_value
from app.http.generation_params import check_token_ids
from app.http.planning import (check_model, check_token_list, choice_generation, fim_generation, fim_prompt,
                               fim_reserve, plan_generation, timings, vocab_limit)

from ..logprobs import LegacyLogprobs
from ..usage import usage
from . import shapes
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

    def _fim_tokens(self, prompt: Prompt, suffix: str, param: str, max_tokens: int | None) -> list[int]:
        """`prompt` is the text (or tokens) before the gap, `suffix` the text after it; trimmed
        (lines farthest from the gap first) to leave the middle its room, as editors expect."""
        if not isinstance(prompt, str):
            check_token_list(prompt, vocab_limit(self.model), param)
        return fim_prompt(self.model, prompt, suffix, reserve=fim_reserve(self.model, max_tokens or DEFAULT_MAX_TOKENS))

    def prepare(self, request: CompletionRequest) -> PreparedCompletion:
        """Everything that can fail because of the request fails here, before any output."""
        check_model(self.model, request.model)
        self.model.engine.check_admission()
        check_token_ids(request.params, self.model.tokenizer.vocab_size)
        prepared = []
        for i, prompt in enumerate(request.prompts):
            param = "prompt" if len(request.prompts) == 1 else f"prompt[{i}]"
            if request.suffix is not None:
                tokens, text = self._fim_tokens(prompt, request.suffix, param, request.params.max_tokens), ""
            else:
                tokens, text = self._tokens(prompt, param)
            if not tokens:
                raise invalid_value("prompt", f"'{param}' has no tokens")
            generation = plan_generation(self.model, tokens, request.params, param="prompt",
                                         default_max_tokens=DEFAULT_MAX_TOKENS, session_id=request.session_id,
                                         report_progress=request.return_progress)
            if request.suffix is not None:
                generation = fim_generation(self.model, generation)
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

    def pipeline(self, prepared: PreparedCompletion, prompt: PreparedPrompt, choice: int,
                 cancel: CancelToken) -> ChoicePipeline:
        generation = self.model.engine.generate(choice_generation(prompt.generation, choice), cancel)
        return ChoicePipeline(generation, self.model.tokenizer, OutputOptions(stops=prepared.request.params.stop))

    def _logprobs(self, prepared: PreparedCompletion) -> LegacyLogprobs | None:
        k = prepared.request.logprobs
        return None if k is None else LegacyLogprobs(self.model.tokenizer, self.model.stop_token_ids, k)

    def complete(self, prepared: PreparedCompletion, cancel: CancelToken) -> dict[str, Any]:
        """n generations per prompt, in order; usage counts each prompt once."""
        choices, stats = [], [[] for _ in prepared.prompts]
        for index, p, j in self._choices(prepared):
            prompt = prepared.prompts[p]
            output = self.pipeline(prepared, prompt, j, cancel).run()
            stats[p].append(output.stats)
            logprobs = self._logprobs(prepared)
            choices.append(shapes.choice(index, prompt.echo + output.content if prepared.request.echo
                                         else output.content,
                                         logprobs.take(output.events) if logprobs else None, output.finish_reason))
        return shapes.completion(prepared.id, prepared.created, self.model.id, choices, _usage(stats),
                                 timings(*(s for group in stats for s in group)))

    def stream(self, prepared: PreparedCompletion, cancel: CancelToken) -> Iterator[dict[str, Any]]:
        """Per prompt in order: text chunks (the echo first), a finish chunk; then usage if asked."""
        include_usage = prepared.request.include_usage

        def chunk(index: int | None, text: str = "", finish: str | None = None,
                  logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
            choice = None if index is None else shapes.choice(index, text, logprobs, finish)
            return shapes.chunk(prepared.id, prepared.created, self.model.id, choice, include_usage=include_usage)

        stats = [[] for _ in prepared.prompts]
        for index, p, j in self._choices(prepared):
            prompt = prepared.prompts[p]
            pipeline = self.pipeline(prepared, prompt, j, cancel)
            logprobs, reported = self._logprobs(prepared), 0  # events whose logprobs went out already

            def new_logprobs() -> dict[str, Any] | None:
                nonlocal reported
                if logprobs is None:
                    return None
                out, reported = logprobs.take(pipeline.events[reported:]), len(pipeline.events)
                return out

            if prepared.request.echo and prompt.echo:
                yield chunk(index, prompt.echo)
            for delta in pipeline:  # no reasoning or tools here: text, or the prompt's progress
                if isinstance(delta, PromptProgress):
                    progress = chunk(index)
                    progress["prompt_progress"] = delta.as_dict()
                    yield progress
                    continue
                yield chunk(index, delta.text, logprobs=new_logprobs())
            if pipeline.cancelled:
                return
            stats[p].append(pipeline.stats)
            # the finish chunk carries any tokens whose text never went out (held back by a stop string)
            yield chunk(index, "", pipeline.finish_reason, logprobs=new_logprobs())
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
