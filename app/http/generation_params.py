"""Request fields that steer generation, shared by every completion route:
sampling, length, stop strings. This is where each one is validated; the
resulting SamplingParams go unchanged to the native sampler."""

from __future__ import annotations

from dataclasses import dataclass

from app.engine import SamplingParams

from .errors import invalid_value
from .fields import Fields

MAX_STOPS = 16
MAX_STOP_CHARS = 512
MAX_LOGIT_BIAS = 1024


@dataclass(frozen=True)
class GenerationParams:
    sampling: SamplingParams
    max_tokens: int | None  # None: until the context is full
    stop: tuple[str, ...]
    # llama.cpp's and vLLM's ignore_eos: the model's end tokens are banned and stop nothing, so a
    # generation runs to max_tokens (benchmark clients send it for outputs of a set length)
    ignore_eos: bool = False


def parse_generation_params(f: Fields) -> GenerationParams:
    max_tokens = f.integer("max_tokens", None, lo=1)
    max_completion = f.integer("max_completion_tokens", None, lo=1)
    if max_completion is not None:
        max_tokens = max_completion
    sampling = SamplingParams(
        temperature=f.number("temperature", 1.0, lo=0.0, hi=2.0),
        top_p=f.number("top_p", 1.0, lo=0.0, hi=1.0),  # 0 (OpenAI allows it): the best token only
        top_k=f.integer("top_k", 0, lo=0),
        min_p=f.number("min_p", 0.0, lo=0.0, hi=1.0),
        presence_penalty=f.number("presence_penalty", 0.0, lo=-2.0, hi=2.0),
        frequency_penalty=f.number("frequency_penalty", 0.0, lo=-2.0, hi=2.0),
        # below 0.01 positive logits divided by the penalty overflow float32 (and 5e-324 rounds to 0)
        repetition_penalty=f.number("repetition_penalty", 1.0, lo=0.01, hi=10.0),
        logit_bias=_logit_bias(f),
        seed=f.integer("seed", None, lo=-(2**63), hi=2**64 - 1),
    )
    return GenerationParams(sampling=sampling, max_tokens=max_tokens, stop=_stops(f),
                            ignore_eos=f.boolean("ignore_eos", False))


def _stops(f: Fields) -> tuple[str, ...]:
    return stop_strings(f.raw("stop"), "stop")


def stop_strings(value, param: str, *, one_string: bool = True) -> tuple[str, ...]:
    """Stop strings: an array of strings (or, where the API allows it, one string), at most
    MAX_STOPS of at most MAX_STOP_CHARS characters each; empty ones are dropped."""
    if value is None:
        return ()
    stops = [value] if one_string and isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        kind = "a string or an array of strings" if one_string else "an array of strings"
        raise invalid_value(param, f"'{param}' must be {kind}")
    if len(stops) > MAX_STOPS:
        raise invalid_value(param, f"'{param}' takes at most {MAX_STOPS} strings")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise invalid_value(param, f"each of '{param}' must be at most {MAX_STOP_CHARS} characters")
    return tuple(s for s in stops if s)


def _logit_bias(f: Fields) -> dict[int, float]:
    value = f.obj("logit_bias")
    if not value:
        return {}
    if len(value) > MAX_LOGIT_BIAS:
        raise invalid_value("logit_bias", f"'logit_bias' takes at most {MAX_LOGIT_BIAS} entries")
    out: dict[int, float] = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except ValueError:
            raise invalid_value("logit_bias", f"'logit_bias' keys must be token ids, got {key!r}") from None
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise invalid_value("logit_bias", "'logit_bias' values must be numbers from -100 to 100")
        out[token] = float(bias)
    return out


def check_token_ids(params: GenerationParams, vocab_size: int) -> None:
    """Token ids the client named must exist in this model's vocabulary."""
    for token in params.sampling.logit_bias:
        if not 0 <= token < vocab_size:
            raise invalid_value("logit_bias", f"token id {token} is outside the vocabulary (size {vocab_size})")
