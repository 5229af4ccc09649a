"""Chat completions: prompt rendering, planning, and each choice through the output pipeline.

The Responses and Messages APIs prepare their requests here too (as a ChatCompletionRequest)
and read the same ChoicePipeline; only their shapes differ."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Iterator

from app.engine import CancelToken, GenerationRequest
from app.engine.offload import run_blocking
from app.model_host import ServedModel
from app.text.chat_prompt import ChatPrompt, render_chat
from app.text.chat_template import TemplateError
from app.output import ChoicePipeline, ContentDelta, OutputOptions, PromptProgress, ReasoningDelta
from app.text.reasoning import prompt_opens_reasoning
from app.tools import calls_as_text, template_supports_tools, with_tools_system_prompt

from ..common import check_model, choice_generation, plan_generation, timings, usage
from ..errors import APIError
from ..logprobs import logprobs_content
from ..generation_params import check_token_ids
from . import shapes
from .constraints import output_constraint
from .protocol import ChatCompletionRequest


LONG_PROMPT_CHARS = 1 << 16


def _long(request: ChatCompletionRequest) -> bool:
    """More text than the event loop should tokenize in passing."""
    total = 0
    for m in request.messages:
        content = m.get("content")
        total += len(content) if isinstance(content, str) else 0
        if total > LONG_PROMPT_CHARS:
            return True
    return False


@dataclass(frozen=True)
class PreparedChat:
    request: ChatCompletionRequest
    generation: GenerationRequest
    output: OutputOptions  # how each choice's text is read (stops, reasoning, tool calls)
    id: str
    created: int


class ChatCompletions:
    def __init__(self, model: ServedModel):
        self.model = model
        source = model.tokenizer.chat_template or ""
        self._template_takes_tools = template_supports_tools(source)

    def render_prompt(self, request: ChatCompletionRequest, *, system_only: bool = False) -> str:
        """The prompt the model's template writes for `request`; with `system_only`, just its
        leading system turn (with the tools the template puts there)."""
        return self.prompt(request, system_only=system_only).text

    def prompt(self, request: ChatCompletionRequest, *, system_only: bool = False) -> ChatPrompt:
        """The prompt's text and tokens: special tokens only where the template writes them,
        the client's text (a typed `<|im_start|>` too) tokenized as text."""
        if self.model.template is None:
            raise APIError(400, "this model has no chat template", code="no_chat_template")
        messages, tools = request.messages, request.tools
        if not self._template_takes_tools:
            messages = [calls_as_text(m) for m in messages]
            if tools:
                messages, tools = with_tools_system_prompt(messages, tools), None
        if system_only:
            messages = messages[:1] if messages and messages[0].get("role") == "system" else []
        kwargs = {"enable_thinking": False} if self.model.no_think else {}  # --no-think; the request wins
        template = self.model.template
        try:
            return render_chat(self.model.tokenizer,
                               lambda m, t: template.render(m, tools=t, add_generation_prompt=not system_only,
                                                            **(kwargs | request.template_kwargs)),
                               messages, tools)
        except TemplateError as e:
            raise APIError(400, str(e), code="invalid_prompt", param="messages") from None

    def _system_tokens(self, request: ChatCompletionRequest, tokens: list[int]) -> int:
        """How many of the prompt's tokens are its system turn: what a context shift keeps."""
        try:
            system = self.prompt(request, system_only=True).tokens
        except APIError:  # a template that insists on a user turn: keep nothing in particular
            return 0
        n = 0
        while n < min(len(system), len(tokens)) and system[n] == tokens[n]:
            n += 1
        return n

    def prepare(self, request: ChatCompletionRequest) -> PreparedChat:
        """Everything that can fail because of the request fails here, before any output."""
        check_model(self.model, request.model)
        self.model.engine.check_admission()
        check_token_ids(request.params, self.model.tokenizer.vocab_size)
        # a long conversation is rendered and tokenized off the event loop (seconds for megabytes);
        # the engine's admission above bounds how many wait for it
        rendered = run_blocking(self.prompt, request) if _long(request) else self.prompt(request)
        prompt, tokens = rendered.text, rendered.tokens
        generation = plan_generation(self.model, tokens, request.params, param="messages",
                                     session_id=request.session_id, report_progress=request.return_progress)
        if request.top_logprobs:
            generation = replace(generation, top_logprobs=request.top_logprobs)
        if self.model.engine.context_shift:  # --context-shift keeps the system turn (unless --keep says)
            generation = replace(generation, keep=self._system_tokens(request, tokens))
        constraint = output_constraint(request, self.model.grammars)
        if constraint is not None:
            generation = replace(generation, constraint=constraint)
        # A grammar shapes the whole output (no room to think first), so a constrained one is never split.
        reasoning = prompt_opens_reasoning(prompt) if self.model.reasoning and constraint is None else None
        output = OutputOptions(stops=request.params.stop, reasoning_started=reasoning, tools=request.tools,
                               parallel_tool_calls=request.parallel_tool_calls)
        return PreparedChat(request, generation, output, f"chatcmpl-{uuid.uuid4().hex}", int(time.time()))

    def pipeline(self, prepared: PreparedChat, index: int, cancel: CancelToken) -> ChoicePipeline:
        """Choice `index`: its own seed (the request's seed + index), the same prompt (cached after the first)."""
        generation = choice_generation(prepared.generation, index)
        return ChoicePipeline(self.model.engine.generate(generation, cancel), self.model.tokenizer, prepared.output)

    def _logprobs(self, prepared: PreparedChat, events) -> dict[str, Any] | None:
        if not prepared.request.logprobs:
            return None
        return {"content": logprobs_content(self.model.tokenizer, events, self.model.stop_token_ids)}

    def complete(self, prepared: PreparedChat, cancel: CancelToken) -> dict[str, Any]:
        choices, stats = [], []
        for index in range(prepared.request.n):
            output = self.pipeline(prepared, index, cancel).run()
            choices.append(shapes.choice(index, output, self._logprobs(prepared, output.events)))
            stats.append(output.stats)
            if output.finish_reason == "cancelled":
                break
        return shapes.completion(prepared.id, prepared.created, self.model.id, choices,
                                 usage(*stats, shared_prompt=True), timings(*stats))

    def stream(self, prepared: PreparedChat, cancel: CancelToken) -> Iterator[dict[str, Any]]:
        """Per choice in turn: a role chunk, content (or tool-call) chunks, a finish chunk; then usage if asked."""
        request = prepared.request
        stats = []
        for index in range(request.n):
            pipeline = self.pipeline(prepared, index, cancel)
            yield from self._stream_choice(prepared, index, pipeline)
            stats.append(pipeline.stats)
            if pipeline.cancelled:
                return
        if request.include_usage:
            final = self._chunk(prepared, None)
            final["usage"] = usage(*stats, shared_prompt=True)
            yield final

    def _chunk(self, prepared: PreparedChat, choice: dict[str, Any] | None) -> dict[str, Any]:
        return shapes.chunk(prepared.id, prepared.created, self.model.id, choice,
                            include_usage=prepared.request.include_usage)

    def _stream_choice(self, prepared: PreparedChat, index: int,
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

