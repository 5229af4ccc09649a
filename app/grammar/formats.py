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


def json_rule(schema: dict[str, Any]) -> str:
    styled = dict(schema)
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
