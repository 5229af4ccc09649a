"""The /infill request (llama.cpp's shape): parsed and validated, nothing else.

The fields every llama.cpp route shares (n_predict, n_cmpl, sampling, samplers, time limits,
response_fields, ...) are read by app.llamacpp.params; /infill's own are the text around the
cursor (`input_prefix`, `input_suffix`), what is typed of the middle (`prompt`) and other
files as context (`input_extra`: llama.vscode's chunks, `{filename, text, time}`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.http.errors import invalid_value
from app.http.fields import Fields
from app.text.fim import ExtraFile

from ..params import LlamaParams, parse_llama_params

MAX_EXTRA_FILES = 256  # llama.vscode's ring holds 16 chunks by default, up to its user's choice


@dataclass(frozen=True)
class InfillRequest:
    llama: LlamaParams
    prefix: str
    suffix: str
    extra: tuple[ExtraFile, ...]
    typed: str  # llama.cpp's `prompt`: what the user already wrote of the middle
    stream: bool = False
    session_id: str | None = None  # the body's, or the request's session header


def parse_infill_request(body: Any) -> InfillRequest:
    f = Fields(dict(Fields.of(body).body))
    llama = parse_llama_params(f)
    prefix = f.string("input_prefix", "")
    suffix = f.string("input_suffix", "")
    typed = f.string("prompt", "")
    extra = _extra(f.raw("input_extra"))
    f.reject_unknown()
    return InfillRequest(llama=llama, prefix=prefix, suffix=suffix, extra=extra, typed=typed, stream=llama.stream,
                         session_id=llama.session_id)


def _extra(value: Any) -> tuple[ExtraFile, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid_value("input_extra", "'input_extra' must be an array of {\"filename\", \"text\"} objects")
    if len(value) > MAX_EXTRA_FILES:
        raise invalid_value("input_extra", f"'input_extra' takes at most {MAX_EXTRA_FILES} chunks")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("text"), str) \
                or not isinstance(item.get("filename", ""), str):
            raise invalid_value(f"input_extra[{i}]", "each 'input_extra' entry needs a string 'text' "
                                                     "and an optional string 'filename'")
        out.append(ExtraFile(item.get("filename", ""), item["text"]))
    return tuple(out)
