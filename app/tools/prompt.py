"""Offering tools to models whose chat template has no tool support (e.g. SmolLM2's ChatML)."""

from __future__ import annotations

import json
import re
from typing import Any

from .parser import declared_tools

_JINJA_TAG = re.compile(r"\{\{(.*?)\}\}|\{%(.*?)%\}", re.S)
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", re.S)
_TOOLS = re.compile(r"\btools\b")


def template_supports_tools(template_source: str) -> bool:
    """True iff the Jinja template's code (not its literal text or strings) references `tools`."""
    for m in _JINJA_TAG.finditer(template_source or ""):
        code = _STRING.sub("''", m.group(1) if m.group(1) is not None else m.group(2))
        if _TOOLS.search(code):
            return True
    return False


def _function(tool: dict) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    out: dict[str, Any] = {"name": fn["name"]}
    if fn.get("description"):
        out["description"] = fn["description"]
    out["parameters"] = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else \
        {"type": "object", "properties": {}}
    return out


def tools_system_prompt(tools: list[dict]) -> str:
    """System-message text listing the tools (name, description, JSON schema) and the call format
    `parse_tool_calls` reads (Hermes / Qwen2.5 wording, which small models follow best)."""
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
        "<tool_call></tool_call> XML tags:\n"
        "<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call>\n\n"
        "If no function is needed, answer the user directly."
    )
