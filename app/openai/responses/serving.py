"""The Responses API on the shared chat pipeline: a ResponsesRequest becomes a
ChatRequest (prompt, plan, grammar: ChatService.prepare), its one choice's
deltas become output items and the typed events that announce them.

The whole response is the fold of the same events a stream sends (OutputWriter), so the
two never disagree. Finished responses go to the store (unless `store` is false) with the
conversation so far, for `previous_response_id` and GET /v1/responses/{id}.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

from app import validation
from app.engine import CancelToken
from app.http.chat import ChatRequest, ChatService, PreparedChat
from app.http.errors import APIError, to_api_error
from app.http.sessions import scoped
from app.http.sse import Named
from app.output import ContentDelta, Delta, ReasoningDelta, ToolArgumentsDelta, ToolCallStart

from ..logprobs import logprobs_content
from . import shapes
from .protocol import ResponsesRequest, ToolRef, items_to_messages, prompt_names
from .store import ResponseStore, StoredResponse


@dataclass(frozen=True)
class PreparedResponse:
    request: ResponsesRequest
    chat: PreparedChat
    history: list[dict[str, Any]]  # the conversation before this response's output (no instructions)
    id: str
    created_at: int
    session_id: str | None
    numbers: Iterator[int] = field(default_factory=itertools.count)  # the stream's sequence numbers


def previous_not_found(response_id: str) -> APIError:
    """OpenAI's answer to a previous_response_id it does not have: 400, not 404."""
    return APIError(400, f"Previous response with id '{response_id}' not found. (This server keeps responses in "
                         "memory, the most recent ones, and only those created with store true.)",
                    code="previous_response_not_found", param="previous_response_id")


def not_found(response_id: str) -> APIError:
    return APIError(404, f"no response with id '{response_id}' is stored here (responses are kept in memory, "
                         "the most recent ones, and only when created with store true)",
                    code="response_not_found", param="previous_response_id")


class Responses:
    def __init__(self, chat: ChatService, store: ResponseStore):
        self.chat = chat
        self.store = store

    @property
    def model_id(self) -> str:
        return self.chat.model.id

    def prepare(self, request: ResponsesRequest) -> PreparedResponse:
        """Everything that can fail because of the request fails here, before any output."""
        history: list[dict[str, Any]] = []
        previous = None
        if request.previous_response_id is not None:
            previous = self.store.get(request.previous_response_id, request.owner)
            if previous is None:
                raise previous_not_found(request.previous_response_id)
            history = list(previous.history)
        history += self._messages(request)
        if not any(m["role"] != "system" for m in history):
            raise APIError(400, "'input' holds no message to answer", code="invalid_value", param="input")
        response_id = f"resp_{uuid.uuid4().hex}"
        # The KV session: the client's prompt_cache_key, else the conversation's (its first response's
        # id), if it can go on (a response not stored cannot be continued by previous_response_id).
        session_id = request.session_id or (previous.session_id if previous else None) \
            or (scoped(response_id, request.owner) if request.store else None)
        chat_request = ChatRequest(
            model=request.model, messages=_with_instructions(request.instructions, history), params=request.params,
            stream=request.stream, include_usage=False, tools=request.tools,
            parallel_tool_calls=request.parallel_tool_calls, tool_choice=request.tool_choice,
            forced_tool=request.forced_tool, response_format=request.response_format, logprobs=request.logprobs,
            top_logprobs=request.top_logprobs, n=1, template_kwargs=request.template_kwargs, session_id=session_id)
        try:
            chat = self.chat.prepare(chat_request)
        except APIError as e:
            if e.param == "messages":  # the prompt is this API's `input`
                e.param = "input"
            raise
        return PreparedResponse(request, chat, history, response_id, int(time.time()), session_id)

    def _messages(self, request: ResponsesRequest) -> list[dict[str, Any]]:
        """The input as chat messages, its item references resolved from the store (OpenAI's
        'Item with id ... not found.' for one it does not hold)."""
        if request.referring_input is None:
            return request.messages
        items = []
        for i, item in enumerate(request.referring_input):
            if isinstance(item, dict) and item.get("type") == "item_reference":
                found = self.store.item(item["id"], request.owner)
                if found is None:
                    raise APIError(404, f"Item with id '{item['id']}' not found. (This server keeps the items of "
                                        "the most recent responses created with store true.)",
                                   code="item_not_found", param=f"input[{i}].id")
                item = found
            items.append(item)
        return items_to_messages(items, "input", prompt_names(request.tool_refs))

    def complete(self, prepared: PreparedResponse, cancel: CancelToken) -> dict[str, Any]:
        """The last event's response: the fold of the stream's events (an error is raised as such)."""
        final: dict[str, Any] = {}  # stays empty only when cancelled: the client is gone
        for event in self._events(prepared, cancel, whole=True):
            if event["type"] in ("response.completed", "response.incomplete"):
                final = event["response"]
        return final

    def keepalive_event(self, prepared: PreparedResponse):
        """The stream's keep-alive while it waits for the model or its prompt is read: a
        `response.in_progress` event (numbered in turn), which Codex's idle timer counts, where
        it does not count an SSE comment."""
        def beat() -> Named:
            event = shapes.lifecycle("in_progress", self._response(prepared, "in_progress", [], None))
            event["sequence_number"] = next(prepared.numbers)
            return Named(event["type"], event)
        return beat

    def stream(self, prepared: PreparedResponse, cancel: CancelToken) -> Iterator[Named]:
        for event in self._events(prepared, cancel):
            yield Named(event["type"], event)

    def _events(self, prepared: PreparedResponse, cancel: CancelToken, *,
                whole: bool = False) -> Iterator[dict[str, Any]]:
        """Every event of the response in order, numbered; the last is response.completed
        (or .incomplete), or response.failed then error (`whole`: the error is raised)."""
        numbers = prepared.numbers  # shared with keepalive_event's events

        def numbered(event: dict[str, Any]) -> dict[str, Any]:
            event["sequence_number"] = next(numbers)
            return event

        started = self._response(prepared, "in_progress", [], None)
        yield numbered(shapes.lifecycle("created", started))
        yield numbered(shapes.lifecycle("in_progress", started))
        writer = OutputWriter(prepared.request.tool_refs)
        model = self.chat.model
        try:
            pipeline = self.chat.pipeline(prepared.chat, 0, cancel)
            reported = 0  # token events whose logprobs went out already
            for delta in pipeline:
                logprobs = None
                if prepared.request.logprobs:  # a text delta carries the tokens since the last delta
                    logprobs = logprobs_content(model.tokenizer, pipeline.events[reported:], model.stop_token_ids)
                    reported = len(pipeline.events)
                for event in writer.push(delta, logprobs):
                    yield numbered(event)
            if pipeline.cancelled:
                return
            incomplete = pipeline.finish_reason == "length"
            for event in writer.finish("incomplete" if incomplete else "completed"):
                yield numbered(event)
            reasoning = writer.reasoning_text()
            reasoning_tokens = len(self.chat.model.tokenizer.encode(reasoning, add_bos=False)) if reasoning else 0
            status = "incomplete" if incomplete else "completed"
            final = self._response(prepared, status, writer.output, shapes.usage(pipeline.stats, reasoning_tokens),
                                   incomplete_reason="max_output_tokens" if incomplete else None,
                                   completed_at=int(time.time()) if not incomplete else None)
        except Exception as e:  # after the start: response.failed, then the error event
            if whole:
                raise
            err = to_api_error(e)
            code = "invalid_prompt" if err.status < 500 else "server_error"
            failed = self._response(prepared, "failed", writer.output, None, error=shapes.error(code, err.message))
            yield numbered(shapes.lifecycle("failed", failed))
            yield numbered(shapes.error_event(err.code, err.message, err.param))
            return
        if prepared.request.store:
            history = prepared.history + items_to_messages([_replayable(i) for i in writer.output], "output",
                                                           prompt_names(prepared.request.tool_refs))
            self.store.put(StoredResponse(final, history, prepared.session_id, prepared.request.owner))
        yield numbered(shapes.lifecycle(status, final))

    def _response(self, prepared: PreparedResponse, status: str, output: list[dict[str, Any]],
                  usage: dict[str, Any] | None, **kw) -> dict[str, Any]:
        return shapes.response(id=prepared.id, created_at=prepared.created_at, model=self.model_id, status=status,
                               output=[dict(item) for item in output], request=prepared.request, usage=usage,
                               previous_response_id=prepared.request.previous_response_id, **kw)


def _with_instructions(instructions: str | None, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`instructions`, then the system (developer) messages that open the conversation, as one
    system message: templates give the first system message its place (and put tools there)."""
    lead = 0
    while lead < len(history) and history[lead]["role"] == "system":
        lead += 1
    texts = ([instructions] if instructions else []) + [m["content"] for m in history[:lead]]
    if not texts:
        return list(history)
    return [{"role": "system", "content": "\n\n".join(texts)}, *history[lead:]]


class OutputWriter:
    """The pipeline's deltas as output items (reasoning, message, function_call), and the
    events that open, fill and close each. `output` holds the items so far, the open one
    as it stands."""

    def __init__(self, tool_refs: dict[str, ToolRef] | None = None):
        self.tool_refs = tool_refs or {}  # the model's function name -> the client's tool
        self.output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being written (also in output)
        self._text = ""  # its text or arguments so far
        self._pending_space = ""  # whitespace not yet placed: it opens no message by itself
        self._calls: dict[int, int] = {}  # the pipeline's tool call index -> output index
        self._logprobs: list[dict[str, Any]] = []  # the open message's tokens' logprobs, if asked for
        self._pending_logprobs: list[dict[str, Any]] = []  # those of _pending_space

    def reasoning_text(self) -> str:
        return "\n".join(p["text"] for item in self.output if item["type"] == "reasoning" for p in item["summary"])

    def push(self, delta: Delta, logprobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The events of `delta`; `logprobs` (when asked for): its tokens', which a text delta carries."""
        if isinstance(delta, ReasoningDelta):
            return self._append("reasoning", delta.text)
        if isinstance(delta, ContentDelta):
            if (self._open is None or self._open["type"] != "message") and not delta.text.strip():
                self._pending_space += delta.text
                self._pending_logprobs += logprobs or []
                return []
            text, self._pending_space = self._pending_space + delta.text, ""
            logprobs, self._pending_logprobs = self._pending_logprobs + (logprobs or []), []
            return self._append("message", text, logprobs)
        if isinstance(delta, ToolCallStart):
            self._pending_space, self._pending_logprobs = "", []
            events = self._close("completed")
            ref = self.tool_refs.get(delta.name)
            if ref is not None and ref.kind == "custom":
                item = shapes.custom_tool_call_item(f"ctc_{uuid.uuid4().hex}", "in_progress", delta.id, ref.name, "")
            else:
                item = shapes.function_call_item(f"fc_{uuid.uuid4().hex}", "in_progress", delta.id,
                                                 ref.name if ref else delta.name, "",
                                                 namespace=ref.namespace if ref else None)
            self._calls[delta.index] = len(self.output)
            return events + self._start(item)
        if isinstance(delta, ToolArgumentsDelta):
            index = self._calls[delta.index]
            item = self.output[index]
            if item["type"] == "custom_tool_call":  # its input is known once the arguments are whole
                self._text += delta.fragment
                return []
            if item is not self._open:  # arguments of an earlier call: not expected from the parser
                item["arguments"] += delta.fragment
                return [shapes.arguments_delta(item["id"], index, delta.fragment)]
            self._text += delta.fragment
            item["arguments"] = self._text
            return [shapes.arguments_delta(item["id"], index, delta.fragment)]
        raise TypeError(f"not a delta: {delta!r}")

    def finish(self, status: str) -> list[dict[str, Any]]:
        """Close the open item (`status`: completed, or incomplete when the output was cut);
        an output with no item at all still gets its (empty) message."""
        events = self._append("message", self._pending_space, self._pending_logprobs) if not self.output else []
        self._pending_space, self._pending_logprobs = "", []
        return events + self._close(status)

    def _append(self, kind: str, text: str, logprobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        events = []
        if self._open is None or self._open["type"] != kind:
            events += self._close("completed")
            item_id = f"msg_{uuid.uuid4().hex}" if kind == "message" else f"rs_{uuid.uuid4().hex}"
            item = shapes.message_item(item_id, "in_progress", None) if kind == "message" \
                else shapes.reasoning_item(item_id, "in_progress", None)
            events += self._start(item)
            index = len(self.output) - 1
            events.append(shapes.content_part("added", item_id, index, "") if kind == "message"
                          else shapes.summary_part_event("added", item_id, index, ""))
            item["content" if kind == "message" else "summary"] = [
                shapes.text_part("") if kind == "message" else shapes.summary_part("")]
        item, index = self._open, len(self.output) - 1
        self._text += text
        if kind == "message":
            self._logprobs += logprobs or []
            item["content"] = [shapes.text_part(self._text, self._logprobs)]
            events.append(shapes.text_delta(item["id"], index, text, logprobs))
        else:
            item["summary"] = [shapes.summary_part(self._text)]
            events.append(shapes.summary_delta(item["id"], index, text))
        return events

    def _start(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self.output.append(item)
        self._open, self._text, self._logprobs = item, "", []
        return [shapes.item_added(len(self.output) - 1, dict(item, **_copies(item)))]

    def _close(self, status: str) -> list[dict[str, Any]]:
        item = self._open
        if item is None:
            return []
        index, text, logprobs = len(self.output) - 1, self._text, self._logprobs
        self._open, self._text, self._logprobs = None, "", []
        item["status"] = status
        if item["type"] == "message":
            events = [shapes.text_done(item["id"], index, text, logprobs),
                      shapes.content_part("done", item["id"], index, text, logprobs)]
        elif item["type"] == "reasoning":
            events = [shapes.summary_done(item["id"], index, text),
                      shapes.summary_part_event("done", item["id"], index, text)]
        elif item["type"] == "custom_tool_call":
            item["input"] = _custom_input(text)
            events = [shapes.custom_input_delta(item["id"], index, item["input"]),
                      shapes.custom_input_done(item["id"], index, item["input"])]
        else:
            events = [shapes.arguments_done(item["id"], index, item["name"], item["arguments"])]
        return events + [shapes.item_done(index, dict(item, **_copies(item)))]


def _copies(item: dict[str, Any]) -> dict[str, Any]:
    """The item's lists copied, so an event holds the item as it was when sent."""
    return {k: [dict(x) for x in v] for k, v in item.items() if isinstance(v, list)}


def _custom_input(arguments: str) -> str:
    """A custom tool's input from the arguments of the function it was offered as ({"input": ...})."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments  # cut short: what there is
    if isinstance(parsed, dict):
        value = parsed.get("input", next(iter(parsed.values()), "") if len(parsed) == 1 else "")
        return value if isinstance(value, str) else json.dumps(value)
    return parsed if isinstance(parsed, str) else json.dumps(parsed)


def _replayable(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as the next turn's input: a call cut short keeps the arguments that parse."""
    if item["type"] != "function_call":
        return item
    arguments = validation.try_loads(item["arguments"])[1]
    return dict(item, arguments=json.dumps(arguments if isinstance(arguments, dict) else {}))
