"""The request fields llama.cpp's own routes (/completion, /infill) share, read with llama.cpp's
names, defaults and meanings.

- `n_predict`: how many tokens to generate; -1 (any negative): until an end token or the
  context's end; 0: read the prompt into the cache and generate nothing (editors send it to
  warm the cache when a file opens). `max_tokens` is its other name, as in llama.cpp.
- `n_cmpl`: completions of the one prompt (llama.vscode's alternatives); more than one answers
  with an array, as llama.cpp does.
- `t_max_predict_ms`: generation ends, as a "limit", once this long has passed since its first
  token and a newline has been written (llama.cpp's rule for editor completions).
- `response_fields`: only these fields in the answer; `a/b` moves `b` of object `a` to the top
  level under the name `a/b`.
- `return_tokens`: the generated token ids in `tokens` (a stream always sends them).
- Sampling defaults are llama.cpp's (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05);
  `seed` -1 (or 4294967295, its "default seed") is a fresh random seed.

llama.cpp's sampling fields (`samplers`, `repeat_penalty`, `cache_prompt`, the samplers this
server lacks at their neutral values, the ignored knobs) are app/http/llama_sampling.py's, which
the chat route reads too; every other field is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from app.http.errors import invalid_value
from app.http.fields import Fields
from app.http.generation_params import GenerationParams
from app.http.llama_sampling import parse_llama_sampling
from app.http.sessions import parse_session_id

MAX_N_CMPL = 8
MAX_RESPONSE_FIELDS = 64
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
    if body.get("seed") in RANDOM_SEEDS and not isinstance(body.get("seed"), bool):
        body.pop("seed")
    for name, value in DEFAULTS.items():
        body.setdefault(name, value)
    sampling = parse_llama_sampling(f)
    params = replace(sampling.params, max_tokens=n_predict if n_predict > 0 else None)
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
        samplers=sampling.samplers,
        session_id=parse_session_id(f.raw("session_id")),
        cache_prompt=sampling.cache_prompt,
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
