"""llama.cpp's sampling fields, read wherever llama.cpp's server reads them: its own routes
(/completion, /infill) and the OpenAI-compatible chat route, to which llama.cpp's web UI, Open
WebUI's llama.cpp presets and SillyTavern send them with every request.

- `repeat_penalty` is `repetition_penalty`'s llama.cpp name.
- `samplers`: which samplers run. This server's order is fixed (penalties, top_k, top_p, min_p,
  temperature), so the order is not honoured, but a sampler left out is off, as in llama.cpp.
  `infill` (llama.cpp's FIM-specific sampler) is accepted and has no counterpart here.
- `cache_prompt: false`: nothing of the prompt is reused from a cache; all of it is computed.
- Knobs of llama.cpp's slot and cache machinery that cannot change what the user gets are
  accepted and ignored (IGNORED). Samplers this server does not have are accepted at their
  neutral value and refused by name at any other (NEUTRAL).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from .errors import invalid_value
from .fields import Fields
from .generation_params import GenerationParams, parse_generation_params

# the slot is the scheduler's choice and the cache's reuse its own; the prompt's time limit is
# not enforced by llama.cpp either; these change nothing the user gets
IGNORED = ("t_max_prompt_ms", "id_slot", "n_keep", "n_cache_reuse", "timings_per_token",
           "return_progress", "repeat_last_n", "penalize_nl", "min_keep", "user", "dry_sequence_breakers",
           "dry_base", "dry_allowed_length", "dry_penalty_last_n", "mirostat_tau", "mirostat_eta", "xtc_threshold",
           "dynatemp_exponent", "post_sampling_probs", "backend_sampling")


def _is(value: Any) -> Callable[[Any], bool]:
    return lambda v: v == value


# samplers this server does not have: accepted at the value that turns them off
NEUTRAL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "typical_p": (_is(1), "1"),
    "typ_p": (_is(1), "1"),  # its web UI's name for it
    "dynatemp_range": (_is(0), "0"),
    "xtc_probability": (_is(0), "0"),
    "dry_multiplier": (_is(0), "0"),
    "mirostat": (_is(0), "0"),
    "top_n_sigma": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0, "-1"),
    "n_probs": (_is(0), "0"),
    "lora": (lambda v: v == [], "[] (no LoRA adapters are loaded)"),
    "grammar": (_is(""), "\"\""),
    "json_schema": (lambda v: v == {}, "{}"),
}
# llama.cpp's sampler names (and the one-letter forms of its sampler string) -> ours
SAMPLERS = {"penalties": "penalties", "dry": "dry", "top_k": "top_k", "typ_p": "typical_p", "typical_p": "typical_p",
            "top_p": "top_p", "nucleus": "top_p", "min_p": "min_p", "xtc": "xtc", "temperature": "temperature",
            "temp": "temperature", "infill": "infill", "top_n_sigma": "top_n_sigma", "mirostat": "mirostat"}
SAMPLER_CHARS = {"e": "penalties", "d": "dry", "k": "top_k", "y": "typical_p", "p": "top_p", "m": "min_p",
                 "x": "xtc", "t": "temperature", "i": "infill", "s": "top_n_sigma"}


@dataclass(frozen=True)
class LlamaSampling:
    params: GenerationParams  # with the samplers left out of `samplers` off
    samplers: tuple[str, ...] | None
    cache_prompt: bool  # false: the whole prompt computed, nothing reused


def parse_llama_sampling(f: Fields) -> LlamaSampling:
    """parse_generation_params with llama.cpp's fields too (`f.body` may be rewritten: llama.cpp's
    names to ours)."""
    body = f.body
    if "repeat_penalty" in body:
        if "repetition_penalty" in body:
            raise invalid_value("repeat_penalty", "give 'repeat_penalty' or 'repetition_penalty', not both")
        body["repetition_penalty"] = body.pop("repeat_penalty")
    for name, (neutral, says) in NEUTRAL.items():
        value = f.raw(name)
        if value is not None and not neutral(value):
            raise invalid_value(name, f"'{name}' is not supported here (only {says} is accepted)")
    for name in IGNORED:
        f.raw(name)
    samplers = _samplers(f.raw("samplers"))
    params = parse_generation_params(f)
    if samplers is not None:
        params = replace(params, sampling=_without_missing_samplers(params.sampling, samplers))
    return LlamaSampling(params=params, samplers=samplers, cache_prompt=f.boolean("cache_prompt", True))


def _samplers(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        unknown = [c for c in value if c not in SAMPLER_CHARS]
        if unknown:
            raise invalid_value("samplers", f"'samplers' has an unknown sampler letter '{unknown[0]}'")
        return tuple(SAMPLER_CHARS[c] for c in value)
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value) or len(value) > 32:
        raise invalid_value("samplers", "'samplers' must be an array of sampler names or a string of their letters")
    unknown = [s for s in value if s not in SAMPLERS]
    if unknown:
        raise invalid_value("samplers", f"'samplers' has an unknown sampler '{unknown[0]}' "
                                        f"(known: {', '.join(sorted(set(SAMPLERS)))})")
    return tuple(SAMPLERS[s] for s in value)


def _without_missing_samplers(sampling, samplers: tuple[str, ...]):
    """A sampler left out of `samplers` does not run: its parameter at its neutral value."""
    off: dict[str, Any] = {}
    if "top_k" not in samplers:
        off["top_k"] = 0
    if "top_p" not in samplers:
        off["top_p"] = 1.0
    if "min_p" not in samplers:
        off["min_p"] = 0.0
    if "temperature" not in samplers:
        off["temperature"] = 1.0
    if "penalties" not in samplers:
        off.update(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
    return replace(sampling, **off)
