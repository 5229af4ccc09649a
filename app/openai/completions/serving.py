"""Text completions: prompts to tokens, one generation per prompt, the OpenAI response shapes."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

from app.engine import CancelToken, GenerationRequest
from app.model_host import ServedModel
from app.textgen import TextStream

from ..common import check_model, check_token_list, plan_generation, timings, usage, vocab_limit
from ..errors import invalid_value
from ..generation_params import check_token_ids
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
                                         default_max_tokens=DEFAULT_MAX_TOKENS)
            prepared.append(PreparedPrompt(generation, text))
        return PreparedCompletion(request, prepared, f"cmpl-{uuid.uuid4().hex}", int(time.time()))

    def _text_stream(self, prepared: PreparedCompletion, prompt: PreparedPrompt, cancel: CancelToken) -> TextStream:
        generation = self.model.engine.generate(prompt.generation, cancel)
        return TextStream(generation, self.model.tokenizer, prepared.request.params.stop)

    def complete(self, prepared: PreparedCompletion, cancel: CancelToken) -> dict[str, Any]:
        """One generation per prompt, in order; usage sums them."""
        choices, stats = [], []
        for index, prompt in enumerate(prepared.prompts):
            stream = self._text_stream(prepared, prompt, cancel)
            text = stream.text()
            stats.append(stream.stats)
            choices.append({
                "index": index,
                "text": prompt.echo + text if prepared.request.echo else text,
                "logprobs": None,
                "finish_reason": stream.finish_reason,
            })
        return {
            "id": prepared.id,
            "object": "text_completion",
            "created": prepared.created,
            "model": self.model.id,
            "choices": choices,
            "usage": usage(*stats),
            "timings": timings(*stats),
        }

    def stream(self, prepared: PreparedCompletion, cancel: CancelToken) -> Iterator[dict[str, Any]]:
        """Per prompt in order: text chunks (the echo first), a finish chunk; then usage if asked."""
        include_usage = prepared.request.include_usage

        def chunk(index: int | None, text: str = "", finish: str | None = None) -> dict[str, Any]:
            out = {
                "id": prepared.id,
                "object": "text_completion",
                "created": prepared.created,
                "model": self.model.id,
                "choices": [] if index is None else [
                    {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
                ],
            }
            if include_usage:
                out["usage"] = None
            return out

        stats = []
        for index, prompt in enumerate(prepared.prompts):
            stream = self._text_stream(prepared, prompt, cancel)
            if prepared.request.echo and prompt.echo:
                yield chunk(index, prompt.echo)
            for text in stream:
                yield chunk(index, text)
            if stream.finish_reason == "cancelled":
                return
            stats.append(stream.stats)
            yield chunk(index, "", stream.finish_reason)
        if include_usage:
            final = chunk(None)
            final["usage"] = usage(*stats)
            yield final
