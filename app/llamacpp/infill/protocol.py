"""The /infill request (llama.cpp's shape): parsed and validated, nothing else.

llama.cpp's sampling names are read as ours (`n_predict` is max_tokens, `repeat_penalty`
the repetition penalty); its knobs for its own slot and sampler machinery, which this
server has no counterpart for, are accepted and change nothing (IGNORED); any other
field is refused by name, as on every route.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.openai.errors import invalid_value
from app.openai.fields import Fields
from app.openai.generation_params import GenerationParams, parse_generation_params
from app.openai.sessions import parse_session_id
from app.text.fim import ExtraFile

MAX_EXTRA_FILES = 64
# llama.cpp request fields with no counterpart here: its prompt cache is always on here, its
# sampler order, slot, time limits and indent heuristics are its own.
IGNORED = ("cache_prompt", "samplers", "t_max_prompt_ms", "t_max_predict_ms", "id_slot",
           "response_fields", "n_keep", "n_cache_reuse", "return_tokens", "timings_per_token", "post_sampling_probs",
           "typical_p", "dynatemp_range", "dynatemp_exponent", "xtc_probability", "xtc_threshold", "mirostat",
           "mirostat_tau", "mirostat_eta", "repeat_last_n", "dry_multiplier", "dry_base", "dry_allowed_length",
           "dry_penalty_last_n", "dry_sequence_breakers", "top_n_sigma", "lora", "user")
# llama.cpp name -> ours
RENAMED = {"n_predict": "max_tokens", "repeat_penalty": "repetition_penalty"}


@dataclass(frozen=True)
class InfillRequest:
    model: str | None
    prefix: str
    suffix: str
    extra: tuple[ExtraFile, ...]
    typed: str  # llama.cpp's `prompt`: what the user already wrote of the middle
    n_indent: int  # the middle ends before a line indented less than this (0: no such end)
    params: GenerationParams
    stream: bool
    session_id: str | None = None


def parse_infill_request(body: Any) -> InfillRequest:
    body = dict(Fields.of(body).body)
    n_predict = body.get("n_predict")
    if isinstance(n_predict, int) and not isinstance(n_predict, bool) and n_predict < 0:
        body.pop("n_predict")  # llama.cpp's -1: until the model ends the middle or the context is full
    for theirs, ours in RENAMED.items():
        if theirs in body:
            if ours in body:
                raise invalid_value(theirs, f"give '{theirs}' or '{ours}', not both")
            body[ours] = body.pop(theirs)
    if body.get("ignore_eos"):
        raise invalid_value("ignore_eos", "'ignore_eos' is not supported: the middle ends with the model's end token")
    if body.get("n_probs"):
        raise invalid_value("n_probs", "'n_probs' is not supported on /infill")
    f = Fields(body)
    model = f.string("model", None)
    prefix = f.string("input_prefix", "")
    suffix = f.string("input_suffix", "")
    typed = f.string("prompt", "")
    extra = _extra(f.raw("input_extra"))
    n_indent = f.integer("n_indent", 0, lo=0, hi=4096)
    params = parse_generation_params(f)
    stream = f.boolean("stream", False)
    session_id = parse_session_id(f.raw("session_id"))
    for name in IGNORED + ("ignore_eos", "n_probs"):
        f.raw(name)
    f.reject_unknown()
    return InfillRequest(model=model, prefix=prefix, suffix=suffix, extra=extra, typed=typed, n_indent=n_indent,
                         params=params,
                         stream=stream, session_id=session_id)


def _extra(value: Any) -> tuple[ExtraFile, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid_value("input_extra", "'input_extra' must be an array of {\"filename\", \"text\"} objects")
    if len(value) > MAX_EXTRA_FILES:
        raise invalid_value("input_extra", f"'input_extra' takes at most {MAX_EXTRA_FILES} files")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("text"), str) \
                or not isinstance(item.get("filename", ""), str):
            raise invalid_value(f"input_extra[{i}]", "each 'input_extra' entry needs a string 'text' "
                                                     "and an optional string 'filename'")
        out.append(ExtraFile(item.get("filename", ""), item["text"]))
    return tuple(out)
