"""Typing raw XML parameter text by the tool's JSON schema (Qwen `<parameter=P>value</parameter>`)."""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

from app.validation import MAX_DEPTH, try_loads

_INT = re.compile(r"[-+]?\d+\Z")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\Z")
_FAIL = object()


def schema_types(schema: Any) -> list[str]:
    """The JSON types a schema allows, in order ("type" as a string or list, then anyOf/oneOf members)."""
    if not isinstance(schema, dict):
        return []
    out: list[str] = []
    t = schema.get("type")
    for name in ([t] if isinstance(t, str) else t if isinstance(t, list) else []):
        if isinstance(name, str) and name not in out:
            out.append(name)
    for key in ("anyOf", "oneOf"):
        subs = schema.get(key)
        for sub in subs if isinstance(subs, list) else []:  # a client's schema: anything may be there
            for name in schema_types(sub):
                if name not in out:
                    out.append(name)
    if not out and isinstance(schema.get("enum"), list) and schema["enum"]:
        if all(isinstance(v, str) for v in schema["enum"]):
            out.append("string")
    return out


def _bracket_depth(s: str) -> int:
    """How deep the brackets of `s` go (quotes ignored: an upper bound is all that is needed)."""
    level = deepest = 0
    for c in s:
        if c in "([{":
            level += 1
            deepest = max(deepest, level)
        elif c in ")]}":
            level -= 1
    return deepest


def _json_or_python(s: str) -> Any:
    """JSON, or a Python literal (small models write `{'a': 1}`) that survives a JSON round trip."""
    parsed, value = try_loads(s)
    if parsed:
        return value
    if _bracket_depth(s) > MAX_DEPTH:  # literal_eval recurses as deep as the brackets go
        return _FAIL
    try:
        value = ast.literal_eval(s)
        json.dumps(value)
        return value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _FAIL


def _as(kind: str, s: str) -> Any:
    try:
        return _as_checked(kind, s)
    except ValueError:  # an integer of more digits than Python converts (4,300): not that kind
        return _FAIL


def _as_checked(kind: str, s: str) -> Any:
    low = s.lower()
    if kind == "null":
        return None if low in ("null", "none") else _FAIL
    if kind == "boolean":
        return {"true": True, "false": False}.get(low, _FAIL)
    if kind == "integer":
        if _INT.match(s):
            return int(s)
        if _NUMBER.match(s) and float(s).is_integer() and math.isfinite(float(s)):
            return int(float(s))
        return _FAIL
    if kind == "number":
        if _INT.match(s):
            return int(s)
        if _NUMBER.match(s) and math.isfinite(float(s)):
            return float(s)
        return _FAIL
    if kind in ("object", "array"):
        value = _json_or_python(s)
        return value if isinstance(value, dict if kind == "object" else list) else _FAIL
    return _FAIL


def coerce_value(raw: str, schema: Any) -> Any:
    """Raw parameter text → a JSON value.

    string stays the raw text; integer/number/boolean/null by their literal forms; object/array as JSON
    (or a Python literal). A value that fits none of the declared types stays a string. No type
    declared (or only unknown ones): JSON if it parses, else the string.
    """
    types = schema_types(schema)
    s = raw.strip()
    known = [t for t in types if t in ("null", "boolean", "integer", "number", "object", "array", "string")]
    if not known:
        parsed, value = try_loads(s)
        return value if parsed else raw
    if known == ["string"]:
        return raw
    for kind in ("null", "boolean", "integer", "number", "object", "array"):
        if kind in known:
            value = _as(kind, s)
            if value is not _FAIL:
                return value
    return raw
