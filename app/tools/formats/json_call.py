"""JSON calls outside any tag: a bare `{"name": ..., "arguments"|"parameters": ...}` (or a list of
them) that is the whole output, or a ```` ```json ```` / ```` ``` ```` fence whose body is such
JSON (the fence may sit in prose). A fence that is not a call is ordinary content."""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Any, Optional

from app.grammar.formats import json_rule
from app.validation import MAX_DEPTH, STRICT_DECODER, depth

from ..calls import Call, Calls, Judged, Segment, Text, Tools, Verdict, call_from_obj, judge

FENCE = "```"
# What a bare JSON call must start with; failing this on a prefix fails on every extension.
_BARE_START = re.compile(r'\{\s*(?:"|\Z)|\[\s*(?:\{\s*(?:"|\Z)|\Z)')
# strict JSON only (no NaN, Infinity or 1e400: arguments go back to clients, and come back to us,
# as JSON), at most MAX_DEPTH deep
_DECODER = STRICT_DECODER


def json_values(s: str) -> Optional[list[Any]]:
    """One or more whitespace-separated JSON values making up all of `s`, or None."""
    s = s.strip()
    out, i = [], 0
    while i < len(s):
        try:
            value, i = _DECODER.raw_decode(s, i)
        except (ValueError, RecursionError):
            return None
        if depth(value) > MAX_DEPTH:
            return None
        out.append(value)
        while i < len(s) and s[i].isspace():
            i += 1
    return out or None


def judge_json(values: Optional[list[Any]], tools: Tools) -> Judged:
    if values is None:
        return Judged(Verdict.INVALID)
    calls: list[Optional[Call]] = []
    for v in values:
        if isinstance(v, list):
            calls.extend([call_from_obj(x) for x in v] or [None])  # an empty list is no call
        else:
            calls.append(call_from_obj(v))
    return judge(calls, tools)


def read_fence(buf: str, p: int, final: bool, tools: Tools) -> Optional[tuple[list[Segment], int]]:
    not_call = ([Text(FENCE)], p + len(FENCE))
    j, n = p + len(FENCE), len(buf)
    while j < n and buf[j] in " \t":
        j += 1
    if buf[j:j + 4].lower() == "json":
        j += 4
    elif j + 4 > n and "json".startswith(buf[j:].lower()) and j < n:
        return None if not final else not_call
    while j < n and buf[j].isspace():
        j += 1
    if j == n:
        return None if not final else not_call
    if buf[j] not in "{[":
        return not_call
    close = buf.find(FENCE, j)
    if close == -1:
        if not final:
            return None
        judged = judge_json(json_values(buf[j:]), tools)  # unclosed at the end: accept a complete call
        return ([Calls(judged.calls)], n) if judged.verdict is Verdict.CALLS else not_call
    end = close + len(FENCE)
    judged = judge_json(json_values(buf[j:close]), tools)
    if judged.verdict is Verdict.CALLS:
        return [Calls(judged.calls)], end
    if judged.verdict is Verdict.UNDECLARED:
        return [Text(buf[p:end])], end
    return not_call


class Bare(Enum):
    NO = "no"  # not a bare call
    WAIT = "wait"  # may still become one
    CALLS = "calls"


def read_bare(buf: str, final: bool, tools: Tools) -> tuple[Bare, list[Call]]:
    """`buf` (stripped of leading whitespace) starts with { or [: is all of it one JSON call?"""
    if not _BARE_START.match(buf):
        return Bare.NO, []
    try:
        value, end = _DECODER.raw_decode(buf)
    except json.JSONDecodeError as e:
        if final:
            return Bare.NO, []
        # Invalid for good if the decoder stuck well before the end (a partial token — number, literal,
        # escape — is at most 9 characters) and not in a string that may still be closed.
        if e.pos < len(buf) - 10 and not e.msg.startswith("Unterminated string"):
            return Bare.NO, []
        return Bare.WAIT, []
    except (ValueError, RecursionError):  # NaN, Infinity, 1e400: not JSON, whatever follows
        return Bare.NO, []
    if depth(value) > MAX_DEPTH:
        return Bare.NO, []
    if buf[end:].strip():
        return Bare.NO, []
    judged = judge_json([value], tools)
    if judged.verdict is not Verdict.CALLS:
        return Bare.NO, []
    return (Bare.CALLS, judged.calls) if final else (Bare.WAIT, [])


READERS = {FENCE: read_fence}


_DEFS = ("$defs", "definitions")


def call_schema(name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """One call's JSON: the parameters' `$defs` (pydantic's nested models) lifted to this schema's
    root, where their `#/$defs/...` references point once the parameters sit under `arguments`."""
    arguments = dict(parameters) if isinstance(parameters, dict) else {"type": "object"}
    defs = {k: arguments.pop(k) for k in _DEFS if k in arguments}
    return {
        **defs,
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


# A bare call as far as it is written (maybe fenced): its name so far, and the quote closing it.
# What starts a lazy grammar (app/grammar/lazy.py) once that name begins a tool's. Only the
# name-first form: the one the grammar below writes.
CALL_START = re.compile(r'(?:```(?:json)?[ \t]*\n)?\{\s*"name"\s*:\s*"([^"\\]*)(")?')
# Whitespace a bare call may hold (models pretty-print it), bounded: never a run to max_tokens.
_LOOSE = {"whitespace_flexible": True, "item_separator": ",", "key_separator": ":",
          "whitespace_pattern": r"[ \t]{0,8}(\n[ \t]{0,16}){0,2}"}


def grammar(tools: list[dict[str, Any]]) -> dict[str, str]:
    """Lark rules for one bare call (maybe fenced) to one of `tools`, its arguments validating
    against the tool's parameter schema, in the whitespace the model chose."""
    schemas = [call_schema(t["function"]["name"], t["function"].get("parameters")) for t in tools]
    calls = {f"bare_json_{i}": json_rule({**schema, "x-guidance": _LOOSE}) for i, schema in enumerate(schemas)}
    return {
        "bare_call": r'/[ \t\n]{0,8}/ (bare_json | ("```json\n" | "```\n") bare_json "\n```")',
        "bare_json": " | ".join(calls),
        **calls,
    }
