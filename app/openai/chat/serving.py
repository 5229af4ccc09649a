"""Chat completions: prompt rendering, generation, and the OpenAI response shapes."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

from app.engine import CancelToken, GenerationRequest
from app.model_host import ServedModel
from app.text.chat_template import TemplateError
from app.textgen import TextStream

from ..common import check_model, plan_generation, usage
from ..errors import APIError
from ..generation_params import check_token_ids
from .protocol import ChatCompletionRequest


@dataclass(frozen=True)
class PreparedChat:
    request: ChatCompletionRequest
    generation: GenerationRequest
    id: str
    created: int


class ChatCompletions:
    def __init__(self, model: ServedModel):
        self.model = model

    def check_model(self, name: str | None) -> None:
        check_model(self.model, name)

    def render_prompt(self, request: ChatCompletionRequest) -> str:
        if self.model.template is None:
            raise APIError(400, "this model has no chat template", code="no_chat_template")
        try:
            return self.model.template.render(request.messages, tools=request.tools, add_generation_prompt=True,
                                              **request.template_kwargs)
        except TemplateError as e:
            raise APIError(400, str(e), code="invalid_prompt", param="messages") from None

    def prepare(self, request: ChatCompletionRequest) -> PreparedChat:
        """Everything that can fail because of the request fails here, before any output."""
        self.check_model(request.model)
        self.model.engine.check_admission()
        check_token_ids(request.params, self.model.tokenizer.vocab_size)
        tokens = self.model.tokenizer.encode(self.render_prompt(request))
        generation = plan_generation(self.model, tokens, request.params, param="messages")
        return PreparedChat(request, generation, f"chatcmpl-{uuid.uuid4().hex}", int(time.time()))

    def _text_stream(self, prepared: PreparedChat, cancel: CancelToken) -> TextStream:
        generation = self.model.engine.generate(prepared.generation, cancel)
        return TextStream(generation, self.model.tokenizer, prepared.request.params.stop)

    @staticmethod
    def _usage(stream: TextStream) -> dict[str, Any]:
        return usage(stream.stats)

    def complete(self, prepared: PreparedChat, cancel: CancelToken) -> dict[str, Any]:
        stream = self._text_stream(prepared, cancel)
        text = stream.text()
        return {
            "id": prepared.id,
            "object": "chat.completion",
            "created": prepared.created,
            "model": self.model.id,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": stream.finish_reason,
            }],
            "usage": self._usage(stream),
        }

    def stream(self, prepared: PreparedChat, cancel: CancelToken) -> Iterator[dict[str, Any]]:
        """OpenAI chunks: a role chunk, content chunks, a finish chunk, then usage if asked."""
        include_usage = prepared.request.include_usage

        def chunk(delta: dict[str, Any] | None, finish: str | None = None) -> dict[str, Any]:
            out = {
                "id": prepared.id,
                "object": "chat.completion.chunk",
                "created": prepared.created,
                "model": self.model.id,
                "choices": [] if delta is None else [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if include_usage:
                out["usage"] = None
            return out

        stream = self._text_stream(prepared, cancel)
        yield chunk({"role": "assistant", "content": ""})
        for text in stream:
            yield chunk({"content": text})
        if stream.finish_reason == "cancelled":
            return
        yield chunk({}, stream.finish_reason)
        if include_usage:
            final = chunk(None)
            final["usage"] = self._usage(stream)
            yield final
