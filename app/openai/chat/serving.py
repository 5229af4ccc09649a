"""Chat completions: the shared chat pipeline (app/http/chat.py) prepares each request and runs
each choice; this writes OpenAI's completion and chunks."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

from app.engine import CancelToken
from app.http.chat import ChatRequest, ChatService, PreparedChat
from app.http.planning import timings
from app.output import ChoicePipeline, ContentDelta, PromptProgress, ReasoningDelta

from ..logprobs import logprobs_content
from ..usage import usage
from . import shapes


@dataclass(frozen=True)
class PreparedCompletion:
    chat: PreparedChat
    id: str
    created: int


class ChatCompletions:
    def __init__(self, chat: ChatService):
        self.chat = chat
        self.model = chat.model

    def prepare(self, request: ChatRequest) -> PreparedCompletion:
        """Everything that can fail because of the request fails here, before any output."""
        return PreparedCompletion(self.chat.prepare(request), f"chatcmpl-{uuid.uuid4().hex}", int(time.time()))

    def _logprobs(self, prepared: PreparedCompletion, events) -> dict[str, Any] | None:
        if not prepared.chat.request.logprobs:
            return None
        return {"content": logprobs_content(self.model.tokenizer, events, self.model.stop_token_ids)}

    def complete(self, prepared: PreparedCompletion, cancel: CancelToken) -> dict[str, Any]:
        choices, stats = [], []
        for index in range(prepared.chat.request.n):
            output = self.chat.pipeline(prepared.chat, index, cancel).run()
            choices.append(shapes.choice(index, output, self._logprobs(prepared, output.events)))
            stats.append(output.stats)
            if output.finish_reason == "cancelled":
                break
        return shapes.completion(prepared.id, prepared.created, self.model.id, choices,
                                 usage(*stats, shared_prompt=True), timings(*stats))

    def stream(self, prepared: PreparedCompletion, cancel: CancelToken) -> Iterator[dict[str, Any]]:
        """Per choice in turn: a role chunk, content (or tool-call) chunks, a finish chunk; then usage if asked."""
        request = prepared.chat.request
        stats = []
        for index in range(request.n):
            pipeline = self.chat.pipeline(prepared.chat, index, cancel)
            yield from self._stream_choice(prepared, index, pipeline)
            stats.append(pipeline.stats)
            if pipeline.cancelled:
                return
        if request.include_usage:
            final = self._chunk(prepared, None)
            final["usage"] = usage(*stats, shared_prompt=True)
            yield final

    def _chunk(self, prepared: PreparedCompletion, choice: dict[str, Any] | None) -> dict[str, Any]:
        return shapes.chunk(prepared.id, prepared.created, self.model.id, choice,
                            include_usage=prepared.chat.request.include_usage)

    def _stream_choice(self, prepared: PreparedCompletion, index: int,
                       pipeline: ChoicePipeline) -> Iterator[dict[str, Any]]:
        reported = 0  # token events whose logprobs went out already
        yield self._chunk(prepared, shapes.stream_choice(index, {"role": "assistant", "content": ""}))
        for d in pipeline:
            if isinstance(d, PromptProgress):  # llama.cpp's form: the role delta, and the progress beside it
                progress = self._chunk(prepared, shapes.stream_choice(index, {"role": "assistant", "content": None}))
                progress["prompt_progress"] = d.as_dict()
                yield progress
                continue
            logprobs = None
            if isinstance(d, (ContentDelta, ReasoningDelta)):  # logprobs ride on the text they produced
                logprobs = self._logprobs(prepared, pipeline.events[reported:])
                reported = len(pipeline.events)
            yield self._chunk(prepared, shapes.stream_choice(index, shapes.delta(d), logprobs))
        if pipeline.cancelled:
            return
        # the finish chunk carries the logprobs of tokens whose text never went out (a stop string,
        # tool-call markup), so the stream reports every token the whole response does
        rest = self._logprobs(prepared, pipeline.events[reported:])
        rest = rest if rest and rest["content"] else None
        last = self._chunk(prepared, shapes.stream_choice(index, {}, rest, pipeline.finish_reason))
        last["timings"] = timings(pipeline.stats)
        yield last

