"""What a constrained generation may produce, written as a Lark grammar.

JSON that validates against a schema (response_format), and the way alternatives are
combined; a tool-call format's own rules live with the format (app.tools.formats.hermes).
"""

from __future__ import annotations

import json
from typing import Any

# JSON as models write it (and Python's json.dumps): ", " and ": ", no free whitespace,
# which small models would otherwise fill with newlines until max_tokens.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


# Keywords whose values are schemas, one or a list or a map of them.
_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames")
_LIST = ("prefixItems", "anyOf", "oneOf")
_MAP = ("properties", "$defs", "definitions", "dependentSchemas")
_OPENED_BY = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def closed_objects(schema: Any, depth: int = 0) -> Any:
    """`schema` with every object that lists its `properties` and says nothing of others closed
    to them (`additionalProperties: false`), as llama.cpp's grammar converter and OpenAI's strict
    mode do: constrained output never invents a key (a 0.5B model, free to, wrote
    `{"city": "Paris", "required": ["city"]}` as a call's arguments, which `fn(**args)` refuses).
    Left as they are: objects under `allOf` or beside a `$ref` (closing one part of an
    intersection would refuse the other part's keys), and anything that opens itself."""
    if not isinstance(schema, dict) or depth > 64:
        return schema
    out = dict(schema)
    for k in _ONE:
        if k in out:
            out[k] = closed_objects(out[k], depth + 1)
    for k in _LIST:
        if isinstance(out.get(k), list):
            out[k] = [closed_objects(s, depth + 1) for s in out[k]]
    for k in _MAP:
        if isinstance(out.get(k), dict):
            out[k] = {n: closed_objects(s, depth + 1) for n, s in out[k].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = closed_objects(out["additionalProperties"], depth + 1)
    if (isinstance(out.get("properties"), dict) and not any(k in out for k in _OPENED_BY)
            and "allOf" not in out and "$ref" not in out):
        out["additionalProperties"] = False
    return out


def json_rule(schema: dict[str, Any]) -> str:
    styled = closed_objects(schema)
    styled["x-guidance"] = {**JSON_STYLE, **(schema.get("x-guidance") or {})}
    return "%json " + json.dumps(styled, ensure_ascii=False)


def json_grammar(schema: dict[str, Any] | None) -> dict[str, str]:
    """Rules for one JSON value: any object (`schema` None, OpenAI's json_object) or one
    validating against `schema`."""
    return {"answer": json_rule(schema if schema is not None else {"type": "object"})}


def output_grammar(*alternatives: dict[str, str]) -> str:
    """A Lark grammar whose output is any one of `alternatives` (each from the builders above)."""
    rules: dict[str, str] = {}
    starts = []
    for alt in alternatives:
        starts.append(next(iter(alt)))
        rules.update(alt)
    return "\n".join([f"start: {' | '.join(starts)}"] + [f"{k}: {v}" for k, v in rules.items()]) + "\n"
