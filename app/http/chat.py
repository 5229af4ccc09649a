"""The chat pipeline every chat-like API shares: the internal request, the prompt the model's
template writes for it (with the tools), planning, the output grammar, and each choice's
ChoicePipeline.

OpenAI's chat completions and Responses and Anthropic's Messages each parse their body into a
`ChatRequest`, `ChatService.prepare` it, and read the same ChoicePipeline; only their shapes
differ (app/openai/chat, app/openai/responses, app/anthropic)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from app.engine import CancelToken, GenerationRequest
from app.engine.offload import run_blocking
from app.model_host import ServedModel
from app.output import ChoicePipeline, OutputOptions
from app.text.chat_prompt import CannotContinue, ChatPrompt, continues_final_message, render_chat
from app.text.chat_template import TemplateError
from app.text.reasoning import prompt_opens_reasoning
from app.tools import calls_as_text, template_supports_tools, with_tools_system_prompt

from .constraints import lazy_calls, output_constraint
from .errors import APIError
from .generation_params import GenerationParams, check_token_ids
from .planning import check_model, choice_generation, plan_generation

MAX_MESSAGES = 4096  # a conversation's messages, in any API
LONG_PROMPT_CHARS = 1 << 16


@dataclass(frozen=True)
class ResponseFormat:
    """response_format json_object (schema None: any JSON object) or json_schema."""

    schema: dict[str, Any] | None
    name: str | None = None


@dataclass(frozen=True)
class ChatRequest:
    """A chat request of any API: messages in the HF chat-template convention, OpenAI function tools."""

    model: str | None
    messages: list[dict[str, Any]]
    params: GenerationParams
    stream: bool
    include_usage: bool
    tools: list[dict[str, Any]] | None
    parallel_tool_calls: bool
    tool_choice: str  # "auto", "none", "required", or "function" (then forced_tool names it)
    forced_tool: str | None
    response_format: ResponseFormat | None
    logprobs: bool
    top_logprobs: int
    n: int
    template_kwargs: dict[str, Any]
    session_id: str | None = None  # body `session_id`, else a session header (app/http/sessions.py)
    return_progress: bool = False  # llama.cpp's: stream prompt_progress chunks while the prompt is read
    cache_prompt: bool = True  # llama.cpp's: false computes the whole prompt, reusing no cache
    reasoning_split: bool = True  # llama.cpp's reasoning_format "none": thinking stays in the content


def _long(request: ChatRequest) -> bool:
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
    request: ChatRequest
    generation: GenerationRequest
    output: OutputOptions  # how each choice's text is read (stops, reasoning, tool calls)


class ChatService:
    def __init__(self, model: ServedModel):
        self.model = model
        source = model.tokenizer.chat_template or ""
        self._template_takes_tools = template_supports_tools(source)

    def render_prompt(self, request: ChatRequest, *, system_only: bool = False) -> str:
        """The prompt the model's template writes for `request`; with `system_only`, just its
        leading system turn (with the tools the template puts there)."""
        return self.prompt(request, system_only=system_only).text

    def prompt(self, request: ChatRequest, *, system_only: bool = False) -> ChatPrompt:
        """The prompt's text and tokens: special tokens only where the template writes them,
        the client's text (a typed `<|im_start|>` too) tokenized as text."""
        if self.model.template is None:
            raise APIError(400, "this model has no chat template", code="no_chat_template")
        messages, tools = request.messages, request.tools
        # a final assistant message is a prefill: continued, not answered (Anthropic's semantics;
        # llama.cpp's chat does the same); one with tool calls is a whole turn
        prefill = not system_only and continues_final_message(messages)
        if not self._template_takes_tools:
            messages = [calls_as_text(m) for m in messages]
            if tools:
                messages, tools = with_tools_system_prompt(messages, tools), None
        if system_only:
            messages = messages[:1] if messages and messages[0].get("role") == "system" else []
        kwargs = {"enable_thinking": False} if self.model.no_think else {}  # --no-think; the request wins
        template = self.model.template
        opens_turn = not (system_only or prefill)  # the template's generation prompt: a new assistant turn
        try:
            return render_chat(self.model.tokenizer,
                               lambda m, t: template.render(m, tools=t, add_generation_prompt=opens_turn,
                                                            **(kwargs | request.template_kwargs)),
                               messages, tools, continue_final=prefill)
        except (TemplateError, CannotContinue) as e:
            raise APIError(400, str(e), code="invalid_prompt", param="messages") from None

    def _system_tokens(self, request: ChatRequest, tokens: list[int]) -> int:
        """How many of the prompt's tokens are its system turn: what a context shift keeps."""
        try:
            system = self.prompt(request, system_only=True).tokens
        except APIError:  # a template that insists on a user turn: keep nothing in particular
            return 0
        n = 0
        while n < min(len(system), len(tokens)) and system[n] == tokens[n]:
            n += 1
        return n

    def prepare(self, request: ChatRequest) -> PreparedChat:
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
        if not request.cache_prompt:
            generation = replace(generation, reuse_prefix=False)
        if self.model.engine.context_shift:  # --context-shift keeps the system turn (unless --keep says)
            generation = replace(generation, keep=self._system_tokens(request, tokens))
        constraint = output_constraint(request, self.model.grammars)
        if constraint is None and not self.model.reasoning:  # (a model's thinking may mention a call)
            constraint = lazy_calls(request, self.model.grammars, self.model.tokenizer)
        if constraint is not None:
            generation = replace(generation, constraint=constraint)
        # A grammar shapes the whole output (no room to think first), so a constrained one is never split.
        split = self.model.reasoning and constraint is None and request.reasoning_split
        reasoning = prompt_opens_reasoning(prompt) if split else None
        output = OutputOptions(stops=request.params.stop, reasoning_started=reasoning, tools=request.tools,
                               parallel_tool_calls=request.parallel_tool_calls)
        return PreparedChat(request, generation, output)

    def pipeline(self, prepared: PreparedChat, index: int, cancel: CancelToken) -> ChoicePipeline:
        """Choice `index`: its own seed (the request's seed + index), the same prompt (cached after the first)."""
        generation = choice_generation(prepared.generation, index)
        return ChoicePipeline(self.model.engine.generate(generation, cancel), self.model.tokenizer, prepared.output)
