"""Hermes calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the format Qwen2.5's
template teaches and the one we ask of models whose template knows no tools. A block may hold a
JSON list of calls, several JSON values, or Qwen XML functions.

This module owns everything about the format: its markers, reading its blocks, the system prompt
that teaches it, an assistant turn's calls written back as history text, and the grammar that
forces it (constrained decoding)."""

from __future__ import annotations

import json
from typing import Any, Optional

from app.grammar.formats import json_rule

from ..calls import Drop, Judged, Segment, Tools, declared_tools, segments_of
from .json_call import call_schema, judge_json, json_values
from .qwen_xml import FUNC_OPEN, judge_xml

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def _judge_block(body: str, tools: Tools, *, closed: bool) -> Judged:
    if FUNC_OPEN in body:
        return judge_xml(body, tools, closed=closed)
    return judge_json(json_values(body), tools)


def read_block(buf: str, p: int, final: bool, tools: Tools) -> Optional[tuple[list[Segment], int]]:
    """A `<tool_call>` block at buf[p]. One left open at the end is accepted when its body is
    nonetheless complete (the model stopped right before its closing tag); a `<tool_call>`
    followed by another before any `</tool_call>` ends there."""
    start = p + len(OPEN)
    close = buf.find(CLOSE, start)
    nxt = buf.find(OPEN, start)
    closed = close != -1 and (nxt == -1 or close < nxt)
    if closed:
        body, end = buf[start:close], close + len(CLOSE)
    elif nxt != -1:
        body, end = buf[start:nxt], nxt
    elif final:
        body, end = buf[start:], len(buf)
    else:
        return None
    return segments_of(_judge_block(body, tools, closed=closed), buf[p:end]), end


def read_stray_close(buf: str, p: int, final: bool, tools: Tools) -> tuple[list[Segment], int]:
    return [Drop()], p + len(CLOSE)


READERS = {OPEN: read_block, CLOSE: read_stray_close}


# ---------------------------------------------------------------------------------------- generation side

def _function(tool: dict) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    out: dict[str, Any] = {"name": fn["name"]}
    if fn.get("description"):
        out["description"] = fn["description"]
    out["parameters"] = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else \
        {"type": "object", "properties": {}}
    return out


def system_prompt(tools: list[dict]) -> str:
    """System-message text listing the tools (name, description, JSON schema) and this call format
    (Hermes / Qwen2.5 wording, which small models follow best)."""
    names = declared_tools(tools)
    listing = "\n".join(
        json.dumps({"type": "function", "function": _function(t)}, ensure_ascii=False)
        for t in tools if isinstance(t, dict) and (t.get("function") or t).get("name") in names
    )
    return (
        "# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listing}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        f"{OPEN}{CLOSE} XML tags:\n"
        f"{OPEN}\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n'
        f"{CLOSE}\n\n"
        "If no function is needed, answer the user directly."
    )


def calls_as_text(calls: list[dict[str, Any]]) -> str:
    """An assistant turn's tool calls (OpenAI shape, arguments as an object or JSON text) written
    as this format, for templates that cannot render tool calls themselves."""
    return "".join(
        f"{OPEN}\n" + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                                 ensure_ascii=False) + f"\n{CLOSE}"
        for c in calls)


def grammar(tools: list[dict[str, Any]], *, parallel: bool, open_tag: str = f'"{OPEN}"',
            close_tag: str = f'"{CLOSE}"') -> dict[str, str]:
    """Lark rules for one call (several with `parallel`) to one of `tools` (OpenAI tool objects),
    each call's arguments validating against that tool's parameter schema. The tags are Lark
    terminals: GrammarCompiler.literal(OPEN) gives the right one for a tokenizer (a token id where
    the tag is one token)."""
    schemas = [call_schema(t["function"]["name"], t["function"].get("parameters")) for t in tools]
    # one JSON document per tool, so that each tool's references resolve in its own schema
    calls = {f"call_json_{i}": json_rule(schema) for i, schema in enumerate(schemas)}
    return {
        # A newline may follow the last call (models like one there), then only end-of-turn.
        "calls": ('call_block ("\\n" call_block)* "\\n"?' if parallel else 'call_block "\\n"?'),
        "call_block": f'{open_tag} "\\n" call_json "\\n" {close_tag}',
        "call_json": " | ".join(calls),
        **calls,
    }
