"""Chat completions: prompt rendering, generation, and the OpenAI response shapes."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Iterator

from app.engine import CancelToken, GenerationRequest
from app.model_host import ServedModel
from app.text.chat_template import TemplateError
from app.text.reasoning import ReasoningSplitter, Split, prompt_opens_reasoning, split_reasoning
from app.textgen import TextStream
from app.tools import (
    ContentDelta,
    StreamingToolParser,
    ToolArgumentsDelta,
    ToolCallStart,
    parse_tool_calls,
    template_supports_tools,
    tools_system_prompt,
)

from ..common import check_model, choice_generation, plan_generation, timings, usage
from ..errors import APIError
from ..logprobs import logprobs_content
from ..generation_params import check_token_ids
from .constraints import output_constraint
from .protocol import ChatCompletionRequest


@dataclass(frozen=True)
class PreparedChat:
    request: ChatCompletionRequest
    generation: GenerationRequest
    id: str
    created: int
    # None: the output is not split; else split <think>…</think> out of it, starting inside the
    # reasoning when True (the template's generation prompt opened it)
    reasoning_started: bool | None = None


class ChatCompletions:
    def __init__(self, model: ServedModel):
        self.model = model
        source = model.tokenizer.chat_template or ""
        self._template_takes_tools = template_supports_tools(source)

    def render_prompt(self, request: ChatCompletionRequest) -> str:
        if self.model.template is None:
            raise APIError(400, "this model has no chat template", code="no_chat_template")
        messages, tools = request.messages, request.tools
        if not self._template_takes_tools:
            messages = [_calls_as_text(m) for m in messages]
            if tools:
                messages, tools = with_tools_system_prompt(messages, tools), None
        kwargs = {"enable_thinking": False} if self.model.no_think else {}  # --no-think; the request wins
        try:
            return self.model.template.render(messages, tools=tools, add_generation_prompt=True,
                                              **(kwargs | request.template_kwargs))
        except TemplateError as e:
            raise APIError(400, str(e), code="invalid_prompt", param="messages") from None

    def prepare(self, request: ChatCompletionRequest) -> PreparedChat:
        """Everything that can fail because of the request fails here, before any output."""
        check_model(self.model, request.model)
        self.model.engine.check_admission()
        check_token_ids(request.params, self.model.tokenizer.vocab_size)
        prompt = self.render_prompt(request)
        tokens = self.model.tokenizer.encode(prompt)
        generation = plan_generation(self.model, tokens, request.params, param="messages",
                                     session_id=request.session_id)
        if request.top_logprobs:
            generation = replace(generation, top_logprobs=request.top_logprobs)
        constraint = output_constraint(request, self.model.grammars)
        if constraint is not None:
            generation = replace(generation, constraint=constraint)
        # A grammar shapes the whole output (no room to think first), so a constrained one is never split.
        reasoning = prompt_opens_reasoning(prompt) if self.model.reasoning and constraint is None else None
        return PreparedChat(request, generation, f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), reasoning)

    def _text_stream(self, prepared: PreparedChat, index: int, cancel: CancelToken) -> TextStream:
        """Choice `index`: its own seed (the request's seed + index), the same prompt (cached after the first)."""
        generation = choice_generation(prepared.generation, index)
        return TextStream(self.model.engine.generate(generation, cancel), self.model.tokenizer,
                          prepared.request.params.stop)

    def _logprobs(self, prepared: PreparedChat, events) -> dict[str, Any] | None:
        if not prepared.request.logprobs:
            return None
        return {"content": logprobs_content(self.model.tokenizer, events, self.model.stop_token_ids)}

    def _choice(self, prepared: PreparedChat, index: int, cancel: CancelToken) -> tuple[dict[str, Any], TextStream]:
        request = prepared.request
        stream = self._text_stream(prepared, index, cancel)
        text = stream.text()
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if prepared.reasoning_started is not None:
            split = split_reasoning(text, started=prepared.reasoning_started)
            text = message["content"] = split.content
            if split.reasoning:
                message["reasoning_content"] = split.reasoning
        finish = stream.finish_reason
        if request.tools:
            parsed = parse_tool_calls(text, request.tools, parallel=request.parallel_tool_calls)
            if parsed.tool_calls:
                message["content"] = parsed.content or None
                message["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in parsed.tool_calls
                ]
                finish = "tool_calls"
        choice = {"index": index, "message": message, "logprobs": self._logprobs(prepared, stream.events),
                  "finish_reason": finish}
        return choice, stream

    def complete(self, prepared: PreparedChat, cancel: CancelToken) -> dict[str, Any]:
        choices, stats = [], []
        for index in range(prepared.request.n):
            choice, stream = self._choice(prepared, index, cancel)
            choices.append(choice)
            stats.append(stream.stats)
            if stream.finish_reason == "cancelled":
                break
        return {
            "id": prepared.id,
            "object": "chat.completion",
            "created": prepared.created,
            "model": self.model.id,
            "choices": choices,
            "usage": usage(*stats, shared_prompt=True),
            "timings": timings(*stats),
        }

    def stream(self, prepared: PreparedChat, cancel: CancelToken) -> Iterator[dict[str, Any]]:
        """Per choice in turn: a role chunk, content (or tool-call) chunks, a finish chunk; then usage if asked."""
        request = prepared.request
        stats = []
        for index in range(request.n):
            stream = self._text_stream(prepared, index, cancel)
            yield from self._stream_choice(prepared, index, stream)
            stats.append(stream.stats)
            if stream.finish_reason == "cancelled":
                return
        if request.include_usage:
            final = self._chunk(prepared, None)
            final["usage"] = usage(*stats, shared_prompt=True)
            yield final

    def _chunk(self, prepared: PreparedChat, choice: dict[str, Any] | None) -> dict[str, Any]:
        out = {
            "id": prepared.id,
            "object": "chat.completion.chunk",
            "created": prepared.created,
            "model": self.model.id,
            "choices": [] if choice is None else [choice],
        }
        if prepared.request.include_usage:
            out["usage"] = None
        return out

    def _stream_choice(self, prepared: PreparedChat, index: int, stream: TextStream) -> Iterator[dict[str, Any]]:
        request = prepared.request
        reported = 0  # events whose logprobs went out already

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            nonlocal reported
            logprobs = None
            if delta.get("content") or delta.get("reasoning_content"):
                logprobs = self._logprobs(prepared, stream.events[reported:])
                reported = len(stream.events)
            return self._chunk(prepared, {"index": index, "delta": delta, "logprobs": logprobs,
                                          "finish_reason": finish})

        parser = StreamingToolParser(request.tools, parallel=request.parallel_tool_calls) if request.tools else None
        splitter = None if prepared.reasoning_started is None \
            else ReasoningSplitter(started=prepared.reasoning_started)

        def deltas(split: Split) -> Iterator[dict[str, Any]]:  # reasoning first; tools parse the content
            if split.reasoning:
                yield {"reasoning_content": split.reasoning}
            if not split.content:
                return
            if parser is None:
                yield {"content": split.content}
            else:
                yield from tool_deltas(parser.push(split.content))

        yield chunk({"role": "assistant", "content": ""})
        for text in stream:
            yield from (chunk(d) for d in deltas(splitter.push(text) if splitter else Split(content=text)))
        if stream.finish_reason == "cancelled":
            return
        if splitter is not None:
            yield from (chunk(d) for d in deltas(splitter.flush()))
        finish = stream.finish_reason
        if parser is not None:
            yield from (chunk(d) for d in tool_deltas(parser.finish()))
            if parser.has_tool_calls:
                finish = "tool_calls"
        last = chunk({}, finish)
        last["timings"] = timings(stream.stats)
        yield last


def tool_deltas(deltas) -> Iterator[dict[str, Any]]:
    """Parser deltas as OpenAI chat deltas (content, or a call's start and its argument fragments)."""
    for d in deltas:
        if isinstance(d, ContentDelta):
            if d.text:
                yield {"content": d.text}
        elif isinstance(d, ToolCallStart):
            yield {"tool_calls": [{"index": d.index, "id": d.id, "type": "function",
                                   "function": {"name": d.name, "arguments": ""}}]}
        elif isinstance(d, ToolArgumentsDelta):
            yield {"tool_calls": [{"index": d.index, "function": {"arguments": d.fragment}}]}


def with_tools_system_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For templates that ignore `tools`: describe them in the system message instead."""
    prompt = tools_system_prompt(tools)
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        first = dict(messages[0], content=messages[0]["content"] + "\n\n" + prompt)
        return [first, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def _calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn's tool calls written into its text, in the format tools_system_prompt asks for."""
    if not message.get("tool_calls"):
        return message
    calls = "".join(
        "<tool_call>\n" + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                                     ensure_ascii=False) + "\n</tool_call>"
        for c in message["tool_calls"])
    content = (message.get("content") or "") + calls
    return {k: v for k, v in message.items() if k != "tool_calls"} | {"content": content}
