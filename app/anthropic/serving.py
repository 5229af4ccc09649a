"""Messages: the chat service prepares and runs the request; its deltas become content blocks.

A request becomes the shared chat pipeline's ChatRequest (ChatService.prepare, app/http/chat.py,
renders the template, tokenizes, plans, compiles the tool_choice grammar); the one ChoicePipeline's
deltas become Anthropic content blocks through `ContentBlocks`, whose events are the stream
and whose fold is the whole message, so the two always agree.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass, replace
from typing import Any, Iterator

from app import validation
from app.engine import CancelToken, GenerationStats
from app.http.chat import ChatRequest, ChatService, PreparedChat
from app.http.errors import APIError
from app.http.planning import check_model
from app.http.sse import Named
from app.output import (ChoicePipeline, ContentDelta, Delta, PromptProgress, ReasoningDelta, ToolArgumentsDelta,
                        ToolCallStart)
from app.text.reasoning import CLOSE_TAG

from . import shapes
from .protocol import MessagesRequest

_ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def new_message_id() -> str:
    return "msg_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def tool_use_id(call_id: str) -> str:
    """Anthropic's `toolu_…` form of the pipeline's call id (the same random part)."""
    return "toolu_" + call_id.removeprefix("call_")


@dataclass(frozen=True)
class PreparedMessage:
    chat: PreparedChat
    id: str
    thinking_budget: int | None = None
    context_bound: bool = False  # the context's room, not the request's max_tokens, bounds the output
    warm_only: bool = False  # max_tokens 0: the prompt is read into the cache (Anthropic's pre-warming), no reply


class BoundedThinking:
    """The pipeline's deltas, with the thinking cut at `budget` tokens (Anthropic's
    thinking.budget_tokens): once the model has thought that long without ending its thinking,
    its generation stops, the end-of-thinking tag is written for it, and a second generation
    (the prompt, the thinking so far, the tag: read from the cache) writes the answer.
    `finish_reason`, `stop_sequence`, `cancelled` and `stats` are the whole output's."""

    def __init__(self, model, prepared: PreparedChat, budget: int | None, cancel: CancelToken):
        self.model, self.prepared, self.budget, self.cancel = model, prepared, budget, cancel
        self._over = False
        self._first = ChoicePipeline(model.engine.generate(prepared.generation, self._token()), model.tokenizer,
                                     prepared.output)
        self._last = self._first
        self._extra = 0  # tokens of the end tag written for the model

    def _token(self) -> CancelToken:
        if self.budget is None:
            return self.cancel
        token = CancelToken(probe=self._stop)
        token.generations = self.cancel.generations  # the request's log line counts the generation
        return token

    def _stop(self) -> bool:
        """The first generation's cancel probe, checked by the engine at each step."""
        if self.cancel.cancelled:
            return True
        events = self._first.events
        if not self._over and len(events) >= self.budget and self._first.thinking \
                and CLOSE_TAG not in self.model.tokenizer.decode([e.token_id for e in events[-16:]]):
            self._over = True  # (the tag just written, not yet seen as the answer's start: no cut)
        return self._over

    def __iter__(self) -> Iterator[Delta]:
        yield from self._first
        if not (self._over and self._first.cancelled and not self.cancel.cancelled):
            return
        generation = self.prepared.generation
        end = self.model.tokenizer.encode(f"\n{CLOSE_TAG}\n\n", add_bos=False)
        used = len(self._first.events) + len(end)
        if used >= generation.max_tokens:
            return
        self._extra = len(end)
        prompt = list(generation.prompt) + [e.token_id for e in self._first.events] + end
        answer = replace(generation, prompt=prompt, max_tokens=generation.max_tokens - used)
        self._last = ChoicePipeline(self.model.engine.generate(answer, self.cancel), self.model.tokenizer,
                                    replace(self.prepared.output, reasoning_started=None))
        yield from self._last

    @property
    def finish_reason(self) -> str | None:
        if self._last is self._first and self._over and not self.cancel.cancelled:
            return "length"  # the budget (or max_tokens) ended it with no room for an answer
        return self._last.finish_reason

    @property
    def stop_sequence(self) -> str | None:
        return self._last.stop_sequence

    @property
    def cancelled(self) -> bool:
        return self.cancel.cancelled or (self._last.cancelled and not self._over)

    @property
    def stats(self) -> GenerationStats:
        first, last = self._first.stats, self._last.stats
        if last is first:
            return first
        return GenerationStats(prompt_tokens=first.prompt_tokens, cached_tokens=first.cached_tokens,
                               completion_tokens=first.completion_tokens + self._extra + last.completion_tokens,
                               finish_reason=last.finish_reason, queued_ms=first.queued_ms + last.queued_ms,
                               prompt_ms=first.prompt_ms + last.prompt_ms, decode_ms=first.decode_ms + last.decode_ms)


class ContentBlocks:
    """Pipeline deltas in, Anthropic stream events out (content_block_start / _delta / _stop);
    `blocks` is the fold of those events: the message's `content`.

    Reasoning opens a thinking block, answer text a text block, each tool call a tool_use
    block whose `input_json_delta`s are its arguments; a block closes when another kind of
    delta comes.
    """

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self._open: int | None = None  # the index of the block deltas go to
        self._tool_blocks: dict[int, int] = {}  # tool call index -> block index
        self._arguments: dict[int, str] = {}  # block index -> its tool call's arguments so far

    def push(self, delta: Delta) -> list[Named]:
        if isinstance(delta, ReasoningDelta):
            return self._add_text("thinking", delta.text, shapes.thinking_block, shapes.thinking_delta)
        if isinstance(delta, ContentDelta):
            return self._add_text("text", delta.text, shapes.text_block, shapes.text_delta)
        if isinstance(delta, ToolCallStart):
            events = self._close()
            index = len(self.blocks)
            self.blocks.append(shapes.tool_use_block(tool_use_id(delta.id), delta.name, {}))
            self._tool_blocks[delta.index], self._arguments[index], self._open = index, "", index
            events.append(shapes.content_block_start(index, shapes.tool_use_block(tool_use_id(delta.id),
                                                                                  delta.name, {})))
            return events
        if isinstance(delta, ToolArgumentsDelta):
            index = self._tool_blocks[delta.index]
            self._arguments[index] += delta.fragment
            return [shapes.content_block_delta(index, shapes.input_json_delta(delta.fragment))]
        raise TypeError(f"not a pipeline delta: {delta!r}")

    def finish(self) -> list[Named]:
        """Close the last block; each tool_use block's `input` is its arguments, parsed."""
        for index, arguments in self._arguments.items():
            parsed = validation.try_loads(arguments)[1] if arguments.strip() else {}
            self.blocks[index]["input"] = parsed if isinstance(parsed, dict) else {}
        return self._close()

    def _add_text(self, kind: str, text: str, block, delta) -> list[Named]:
        key = "thinking" if kind == "thinking" else "text"
        events = []
        if self._open is None or self.blocks[self._open]["type"] != kind:
            events = self._close()
            self._open = len(self.blocks)
            self.blocks.append(block())
            events.append(shapes.content_block_start(self._open, block()))
        self.blocks[self._open][key] += text
        events.append(shapes.content_block_delta(self._open, delta(text)))
        return events

    def _close(self) -> list[Named]:
        if self._open is None:
            return []
        index, self._open = self._open, None
        block = self.blocks[index]
        if block["type"] == "thinking":  # as Anthropic's stream does: the block's signature, then its stop
            block["signature"] = thinking_signature(block["thinking"])
            return [shapes.content_block_delta(index, shapes.signature_delta(block["signature"])),
                    shapes.content_block_stop(index)]
        return [shapes.content_block_stop(index)]


def thinking_signature(thinking: str) -> str:
    """A thinking block's `signature`: clients keep it and send it back with the block (Anthropic's
    is an opaque proof of origin). Here a digest of the text; nothing checks it on the way back."""
    return "etserve:" + hashlib.sha256(thinking.encode("utf-8")).hexdigest()


def stop_reason(pipeline: "ChoicePipeline | BoundedThinking", context_bound: bool = False) -> str | None:
    finish = pipeline.finish_reason
    if finish == "tool_calls":
        return "tool_use"
    if finish == "length":  # Anthropic's own reason when the context window, not max_tokens, ended it
        return "model_context_window_exceeded" if context_bound else "max_tokens"
    if finish == "stop":
        return "stop_sequence" if pipeline.stop_sequence is not None else "end_turn"
    return None


def usage(stats: GenerationStats) -> dict[str, Any]:
    return shapes.usage(stats.prompt_tokens, stats.cached_tokens, stats.completion_tokens)


def warm_usage(stats: GenerationStats) -> dict[str, Any]:
    """A pre-warming request's usage: its prompt read, nothing written (the token the engine
    sampled after it is not output)."""
    return shapes.usage(stats.prompt_tokens, stats.cached_tokens, 0)


class Messages:
    def __init__(self, chat: ChatService):
        self.chat = chat
        self.model = chat.model

    def chat_request(self, request: MessagesRequest) -> ChatRequest:
        return ChatRequest(
            model=request.model, messages=request.messages, params=request.params, stream=request.stream,
            include_usage=False, tools=request.tools, parallel_tool_calls=request.parallel_tool_calls,
            tool_choice=request.tool_choice, forced_tool=request.forced_tool,
            response_format=request.response_format, logprobs=False, top_logprobs=0, n=1,
            template_kwargs=request.template_kwargs, session_id=request.session_id)

    def prepare(self, request: MessagesRequest) -> PreparedMessage:
        """The chat service's preparation; `max_tokens` beyond the room the prompt leaves is
        clamped to it (Claude Code asks 32,000 whatever the context), never refused."""
        try:
            prepared = self.chat.prepare(self.chat_request(request))
        except APIError as e:
            if e.code == "context_length_exceeded":  # Anthropic's words: Claude Code reads the two numbers
                tokens, context = getattr(e, "prompt_tokens", None), getattr(e, "context", None)
                if tokens is not None and context is not None:
                    message = (f"prompt is too long: {tokens} tokens > {context - 1} maximum "
                               f"(this model's context holds {context} tokens)")
                else:
                    message = f"prompt is too long: {e.message}"
                raise APIError(400, message, code=e.code, param=e.param) from None
            raise
        generation = prepared.generation
        if request.max_tokens == 0:  # pre-warming: one token is the engine's least, and is not kept
            return PreparedMessage(replace(prepared, generation=replace(generation, max_tokens=1)), new_message_id(),
                                   warm_only=True)
        if request.max_tokens is not None and request.max_tokens < generation.max_tokens:
            prepared = replace(prepared, generation=replace(generation, max_tokens=request.max_tokens))
        room = self.model.context_length - len(generation.prompt)
        context_bound = prepared.generation.max_tokens == room and not self.model.engine.context_shift \
            and (request.max_tokens is None or request.max_tokens > room)
        return PreparedMessage(prepared, new_message_id(), request.thinking_budget, context_bound)

    def _warm(self, chat: PreparedChat, cancel: CancelToken) -> ChoicePipeline:
        """Read a pre-warming request's prompt into the cache: its pipeline, which writes nothing."""
        return ChoicePipeline(self.model.engine.generate(chat.generation, cancel), self.model.tokenizer, chat.output)

    def count_tokens(self, request: MessagesRequest) -> dict[str, Any]:
        """The prompt's tokens: what a request with this body reads (input_tokens + cache_read_input_tokens)."""
        check_model(self.model, request.model)
        return shapes.token_count(len(self.chat.prompt(self.chat_request(request)).tokens))

    def complete(self, prepared: PreparedMessage, cancel: CancelToken) -> dict[str, Any]:
        if prepared.warm_only:
            pipeline = self._warm(prepared.chat, cancel)
            for _ in pipeline:
                pass
            return shapes.message(prepared.id, self.model.id, [], "max_tokens", None, warm_usage(pipeline.stats))
        pipeline = BoundedThinking(self.model, prepared.chat, prepared.thinking_budget, cancel)
        blocks = ContentBlocks()
        for delta in pipeline:
            blocks.push(delta)
        blocks.finish()
        return shapes.message(prepared.id, self.model.id, blocks.blocks, stop_reason(pipeline, prepared.context_bound),
                              pipeline.stop_sequence, usage(pipeline.stats))

    def keepalive_event(self, prepared: PreparedMessage):
        """The stream's keep-alive: Anthropic's own `ping` event, not an SSE comment."""
        return shapes.ping

    def stream(self, prepared: PreparedMessage, cancel: CancelToken) -> Iterator[Named]:
        """message_start, ping, each block's start / deltas / stop, message_delta, message_stop.

        message_start goes out once the request has its slot and the engine knows how much of the
        prompt its KV cache already holds (the first PromptProgress, before the prompt is read), so
        that its usage splits the prompt into input_tokens and cache_read_input_tokens as
        Anthropic's does; until then the stream's keep-alive pings."""
        chat = replace(prepared.chat, generation=replace(prepared.chat.generation, report_progress=True))
        pipeline = self._warm(chat, cancel) if prepared.warm_only else \
            BoundedThinking(self.model, chat, prepared.thinking_budget, cancel)
        prompt_tokens = len(chat.generation.prompt)
        started = False

        def start(cached: int) -> Iterator[Named]:
            nonlocal started
            started = True
            yield shapes.message_start(shapes.message(prepared.id, self.model.id, [], None, None,
                                                      shapes.usage(prompt_tokens, cached, 0)))
            yield shapes.ping()

        blocks = ContentBlocks()
        for delta in pipeline:
            if isinstance(delta, PromptProgress):  # (a thinking budget's answer reports its own: dropped)
                if not started:
                    yield from start(delta.cache)
                continue
            if not started:
                yield from start(pipeline.stats.cached_tokens)
            if not prepared.warm_only:
                yield from blocks.push(delta)
        if pipeline.cancelled:
            return
        if not started:
            yield from start(pipeline.stats.cached_tokens)
        if prepared.warm_only:
            yield shapes.message_delta("max_tokens", None, warm_usage(pipeline.stats))
            yield shapes.message_stop()
            return
        yield from blocks.finish()
        yield shapes.message_delta(stop_reason(pipeline, prepared.context_bound), pipeline.stop_sequence, usage(pipeline.stats))
        yield shapes.message_stop()
