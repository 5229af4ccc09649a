"""Offering tools to models whose chat template has no tool support (e.g. SmolLM2's ChatML)."""

from __future__ import annotations

import re
from typing import Any

from .formats import hermes

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


def tools_system_prompt(tools: list[dict]) -> str:
    """The system text that lists `tools` and teaches the call format the parser reads."""
    return hermes.system_prompt(tools)


def with_tools_system_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For templates that ignore `tools`: describe them in the system message instead."""
    prompt = tools_system_prompt(tools)
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        first = dict(messages[0], content=messages[0]["content"] + "\n\n" + prompt)
        return [first, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn's tool calls written into its text, in the format the tools prompt asks for."""
    if not message.get("tool_calls"):
        return message
    content = (message.get("content") or "") + hermes.calls_as_text(message["tool_calls"])
    return {k: v for k, v in message.items() if k != "tool_calls"} | {"content": content}
