"""What a constrained generation may produce, written as a Lark grammar.

Two shapes, alone or as alternatives: JSON that validates against a schema
(response_format), and tool calls in the Hermes format that both the Qwen
template and our injected tools prompt ask for:
`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.
"""

from __future__ import annotations

import json
from typing import Any

# JSON as models write it (and Python's json.dumps): ", " and ": ", no free whitespace,
# which small models would otherwise fill with newlines until max_tokens.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _json_rule(schema: dict[str, Any]) -> str:
    styled = dict(schema)
    styled["x-guidance"] = {**JSON_STYLE, **(schema.get("x-guidance") or {})}
    return "%json " + json.dumps(styled, ensure_ascii=False)


def json_grammar(schema: dict[str, Any] | None) -> dict[str, str]:
    """Rules for one JSON value: any object (`schema` None, OpenAI's json_object) or one
    validating against `schema`."""
    return {"answer": _json_rule(schema if schema is not None else {"type": "object"})}


def _call_schema(name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"const": name},
            "arguments": parameters if isinstance(parameters, dict) else {"type": "object"},
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_calls_grammar(tools: list[dict[str, Any]], *, parallel: bool,
                       open_tag: str = '"<tool_call>"', close_tag: str = '"</tool_call>"') -> dict[str, str]:
    """Rules for one tool call (several with `parallel`) to one of `tools` (OpenAI tool
    objects), each call's arguments validating against that tool's parameter schema. The tags
    are Lark terminals (GrammarCompiler.literal gives the right one for a tokenizer)."""
    schemas = [_call_schema(t["function"]["name"], t["function"].get("parameters")) for t in tools]
    call = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return {
        # A newline may follow the last call (models like one there), then only end-of-turn.
        "calls": ('call_block ("\\n" call_block)* "\\n"?' if parallel else 'call_block "\\n"?'),
        "call_block": f'{open_tag} "\\n" call_json "\\n" {close_tag}',
        "call_json": _json_rule(call),
    }


def output_grammar(*alternatives: dict[str, str]) -> str:
    """A Lark grammar whose output is any one of `alternatives` (each from the builders above)."""
    rules: dict[str, str] = {}
    starts = []
    for alt in alternatives:
        starts.append(next(iter(alt)))
        rules.update(alt)
    return "\n".join([f"start: {' | '.join(starts)}"] + [f"{k}: {v}" for k, v in rules.items()]) + "\n"
