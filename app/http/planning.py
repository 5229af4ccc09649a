"""What every generating route shares once a request is parsed: the model and token-id checks,
fitting a prompt and its max_tokens into the context, FIM prompts, each choice's generation, and
the `timings` of a request (llama.cpp's object, which the OpenAI routes send too)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from app.engine import GenerationRequest, GenerationStats
from app.model_host import ServedModel
from app.text import fim

from .errors import APIError, invalid_value, model_not_found
from .generation_params import GenerationParams


def check_model(model: ServedModel, name: str | None) -> None:
    """A single-model server serves whatever `model` a client names (llama.cpp does: clients
    hard-code names such as `gpt-4o` or ExecuTorch's `executorch`) and reports its own id;
    --strict-model-name refuses other names."""
    if name is not None and name != model.id and model.strict_model_name:
        raise model_not_found(name, f"this server serves '{model.id}'")


def vocab_limit(model: ServedModel) -> int:
    """Token ids a client may send: inside both the tokenizer's and the model's vocabulary."""
    return model.vocab_limit


def check_token_list(tokens: list[int], limit: int, param: str) -> None:
    for token in tokens:
        if not 0 <= token < limit:
            raise invalid_value(param, f"token id {token} is outside the vocabulary (size {limit})")


def context_error(prompt_tokens: int, context: int, *, param: str = "messages") -> APIError:
    err = APIError(
        400,
        f"this model's context holds {context} tokens; the prompt has {prompt_tokens}",
        code="context_length_exceeded",
        param=param,
    )
    err.prompt_tokens, err.context = prompt_tokens, context  # for APIs that state them in their own words
    return err


def plan_generation(model: ServedModel, tokens: list[int], params: GenerationParams, *, param: str,
                    default_max_tokens: int | None = None, session_id: str | None = None,
                    report_progress: bool = False) -> GenerationRequest:
    """The engine request for `tokens`, or a 400 when the prompt leaves no room in the context.

    Without max_tokens, generation runs for `default_max_tokens` (or until the context is full),
    cut to the room the prompt leaves. A max_tokens past that room is cut to it too, as llama.cpp
    and Ollama do (finish_reason "length" there): agents ask 32,000 whatever the model (opencode
    without a `limit`, Claude Code), and a refusal sent opencode into compacting a conversation
    that fitted. With --context-shift generation may run past the context's end, so it is kept.
    """
    context = model.context_length
    wanted = params.max_tokens
    shift = model.engine.context_shift  # --context-shift: generation may run past the context's end
    if len(tokens) >= context:
        raise context_error(len(tokens), context, param=param)
    room = context - len(tokens)
    if wanted is None:
        wanted = min(default_max_tokens, room) if default_max_tokens is not None else room
    elif not shift:
        wanted = min(wanted, room)
    if model.max_tokens_cap > 0:  # the operator's limit: generation ends there, finish_reason "length"
        wanted = min(wanted, model.max_tokens_cap)
    sampling, stops = params.sampling, model.stop_token_ids
    if params.ignore_eos:  # banned (a bias of -100, OpenAI's "never") and stopping nothing
        sampling = replace(sampling, logit_bias={**sampling.logit_bias, **{t: -100.0 for t in stops}})
        stops = frozenset()
    return GenerationRequest(prompt=tokens, max_tokens=wanted, sampling=sampling, stop_token_ids=stops,
                             session_id=session_id, report_progress=report_progress)


def fim_prompt(model: ServedModel, prefix: str | list[int], suffix: str, *, extra=(), typed: str = "",
               param: str = "suffix", reserve: int | None = None) -> list[int]:
    """A fill-in-the-middle prompt in the model's own FIM tokens, or a 400 for a model without them.
    With `reserve` (tokens kept free for the middle) a prompt too long is trimmed, not refused."""
    return fit_fim_prompt(model, prefix, suffix, extra=extra, typed=typed, param=param, reserve=reserve)[0]


def fit_fim_prompt(model: ServedModel, prefix: str | list[int], suffix: str, *, extra=(), typed: str = "",
                   param: str = "suffix", reserve: int | None = None) -> tuple[list[int], bool]:
    """fim_prompt, and whether the prompt was trimmed to leave `reserve` tokens of the context
    for the middle (editors send more context than fits and expect the server to cut it)."""
    if model.fim is None:
        raise APIError(400, f"the model '{model.id}' has no fill-in-the-middle tokens ({fim.REQUIRED}): "
                       "it cannot infill", code="fim_not_supported", param=param)
    if reserve is None:
        return model.fim.prompt(model.tokenizer, prefix, suffix, extra=extra, typed=typed), False
    budget = max(8, model.context_length - max(1, reserve))
    return model.fim.fit(model.tokenizer, prefix, suffix, extra=extra, typed=typed, budget=budget)


def fim_reserve(model: ServedModel, max_tokens: int | None) -> int:
    """Tokens of the context a FIM prompt leaves for the middle: what was asked for (or, without
    a limit, a quarter of the context, at most 256 tokens); the prompt keeps at least 32."""
    wanted = max_tokens if max_tokens else min(256, model.context_length // 4)
    return max(1, min(wanted, model.context_length - 32))


def fim_generation(model: ServedModel, generation: GenerationRequest) -> GenerationRequest:
    """A FIM generation also ends where the model moves on to another file or FIM part."""
    assert model.fim is not None
    return replace(generation, stop_token_ids=generation.stop_token_ids | model.fim.end_ids)


def choice_generation(generation: GenerationRequest, index: int) -> GenerationRequest:
    """Choice `index` of a request's n: the same prompt (the engine reuses its cache after the
    first choice, so it is prefilled once), its own seed (the request's seed + index)."""
    if index and generation.sampling.seed is not None:
        return replace(generation, sampling=replace(generation.sampling, seed=generation.sampling.seed + index))
    return generation


def timings(*stats: GenerationStats) -> dict[str, Any]:
    """llama.cpp's `timings` object: where the time of a request went."""
    prompt_n = sum(s.prompt_tokens - s.cached_tokens for s in stats)
    prompt_ms = sum(s.prompt_ms for s in stats)
    predicted_n = sum(s.completion_tokens for s in stats)
    predicted_ms = sum(s.decode_ms for s in stats)
    return {
        "cache_n": sum(s.cached_tokens for s in stats),
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n > 0 else None,
        "prompt_per_second": round(prompt_n * 1000 / prompt_ms, 2) if prompt_ms > 0 else None,
        "predicted_n": predicted_n,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / (predicted_n - 1), 3)
        if predicted_ms > 0 and predicted_n > 1 else None,
        # the first token comes from the prompt's forward call; decode time covers the rest
        "predicted_per_second": round((predicted_n - 1) * 1000 / predicted_ms, 2)
        if predicted_ms > 0 and predicted_n > 1 else None,
        "queued_ms": round(sum(s.queued_ms for s in stats), 3),
        # speculative decoding (llama.cpp's names): tokens guessed and checked, and those accepted
        "draft_n": sum(s.drafted for s in stats),
        "draft_n_accepted": sum(s.draft_accepted for s in stats),
    }
