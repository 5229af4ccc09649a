"""The request fields llama.cpp's own routes (/completion, /infill) share, read with llama.cpp's
names, defaults and meanings.

- `n_predict`: how many tokens to generate; -1 (any negative): until an end token or the
  context's end; 0: read the prompt into the cache and generate nothing (editors send it to
  warm the cache when a file opens). `max_tokens` is its other name, as in llama.cpp.
- `n_cmpl`: completions of the one prompt (llama.vscode's alternatives); more than one answers
  with an array, as llama.cpp does.
- `t_max_predict_ms`: generation ends, as a "limit", once this long has passed since its first
  token and a newline has been written (llama.cpp's rule for editor completions).
- `samplers`: which samplers run. This server's order is fixed (penalties, top_k, top_p, min_p,
  temperature), so the order is not honoured, but a sampler left out is off, as in llama.cpp.
  `infill` (llama.cpp's FIM-specific sampler) is accepted and has no counterpart here.
- `response_fields`: only these fields in the answer; `a/b` moves `b` of object `a` to the top
  level under the name `a/b`.
- `return_tokens`: the generated token ids in `tokens` (a stream always sends them).
- Sampling defaults are llama.cpp's (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05);
  `seed` -1 (or 4294967295, its "default seed") is a fresh random seed.
- `cache_prompt: false`: nothing of the prompt is reused from a cache; all of it is computed.

Knobs of llama.cpp's slot and cache machinery that cannot change what the user gets are
accepted and ignored (IGNORED). Samplers this server does not have are accepted at their
neutral value and refused by name at any other (NEUTRAL); every other field is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from app.http.errors import invalid_value
from app.http.fields import Fields
from app.http.generation_params import GenerationParams, parse_generation_params
from app.http.sessions import parse_session_id

MAX_N_CMPL = 8
MAX_RESPONSE_FIELDS = 64
# the slot is the scheduler's choice and the cache's reuse its own; the prompt's time limit is
# not enforced by llama.cpp either; these change nothing the user gets
IGNORED = ("t_max_prompt_ms", "id_slot", "n_keep", "n_cache_reuse", "timings_per_token",
           "return_progress", "repeat_last_n", "penalize_nl", "min_keep", "user", "dry_sequence_breakers",
           "dry_base", "dry_allowed_length", "dry_penalty_last_n", "mirostat_tau", "mirostat_eta", "xtc_threshold",
           "dynatemp_exponent", "post_sampling_probs")


def _is(value: Any) -> Callable[[Any], bool]:
    return lambda v: v == value


# samplers this server does not have: accepted at the value that turns them off
NEUTRAL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "typical_p": (_is(1), "1"),
    "dynatemp_range": (_is(0), "0"),
    "xtc_probability": (_is(0), "0"),
    "dry_multiplier": (_is(0), "0"),
    "mirostat": (_is(0), "0"),
    "top_n_sigma": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0, "-1"),
    "ignore_eos": (_is(False), "false"),
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
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
RANDOM_SEEDS = (-1, 0xFFFFFFFF)


@dataclass(frozen=True)
class LlamaParams:
    model: str | None
    params: GenerationParams  # max_tokens: None (until the context's end), or n_predict
    n_predict: int  # llama.cpp's: -1 (no limit), 0 (fill the cache only) or a count
    n_cmpl: int
    n_indent: int
    stream: bool
    return_tokens: bool
    t_max_predict_ms: int  # 0: no limit
    response_fields: tuple[str, ...]
    samplers: tuple[str, ...] | None
    session_id: str | None
    cache_prompt: bool = True  # false: the whole prompt computed, nothing reused


def parse_llama_params(f: Fields) -> LlamaParams:
    """Reads the shared fields out of `f` (whose body it may rewrite: llama.cpp's names to ours);
    the caller reads its own fields, then calls f.reject_unknown()."""
    body = f.body
    n_predict = _n_predict(body)
    if "repeat_penalty" in body:
        if "repetition_penalty" in body:
            raise invalid_value("repeat_penalty", "give 'repeat_penalty' or 'repetition_penalty', not both")
        body["repetition_penalty"] = body.pop("repeat_penalty")
    if body.get("seed") in RANDOM_SEEDS and not isinstance(body.get("seed"), bool):
        body.pop("seed")
    for name, value in DEFAULTS.items():
        body.setdefault(name, value)
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
    params = replace(params, max_tokens=n_predict if n_predict > 0 else None)
    return LlamaParams(
        model=f.string("model", None),
        params=params,
        n_predict=n_predict,
        n_cmpl=f.integer("n_cmpl", 1, lo=1, hi=MAX_N_CMPL),
        n_indent=f.integer("n_indent", 0, lo=0, hi=4096),
        stream=f.boolean("stream", False),
        return_tokens=f.boolean("return_tokens", False),
        t_max_predict_ms=f.integer("t_max_predict_ms", 0, lo=0, hi=2**63 - 1) or 0,  # llama.cpp: int64
        response_fields=_response_fields(f.raw("response_fields")),
        samplers=samplers,
        session_id=parse_session_id(f.raw("session_id")),
        cache_prompt=f.boolean("cache_prompt", True),
    )


def _n_predict(body: dict[str, Any]) -> int:
    names = [n for n in ("n_predict", "max_tokens") if n in body]
    if len(names) == 2:
        raise invalid_value("n_predict", "give 'n_predict' or 'max_tokens', not both")
    if not names:
        return -1
    value = body.pop(names[0])
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_value(names[0], f"'{names[0]}' must be an integer (-1: no limit, 0: fill the cache only)")
    return max(value, -1)


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


def _response_fields(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value) \
            or len(value) > MAX_RESPONSE_FIELDS:
        raise invalid_value("response_fields", f"'response_fields' must be an array of at most "
                                               f"{MAX_RESPONSE_FIELDS} field names")
    return tuple(value)


def pick_fields(result: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """llama.cpp's `response_fields`: only the fields named; `a/b` is `result[a][b]`, moved to
    the top level under the name `a/b`; a field that does not exist is left out, not an error."""
    if not fields:
        return result
    out: dict[str, Any] = {}
    for name in fields:
        value: Any = result
        for part in name.split("/"):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            out[name] = value
    return out
