"""What tool-call parsing deals in: declared tools, calls, the deltas a stream of them is told in,
and the small typed results each format's reader returns to the scanner."""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Optional, Union

from app.validation import try_loads

_ID_ALPHABET = string.ascii_letters + string.digits


def new_call_id() -> str:
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, serialized


@dataclass(frozen=True)
class ParsedOutput:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolArgumentsDelta:
    index: int
    fragment: str


Delta = Union[ContentDelta, ToolCallStart, ToolArgumentsDelta]

# A call as read from the text, before it gets an id: (tool name, arguments object)
Call = tuple[str, dict]
# Declared tools: name -> parameters schema
Tools = dict[str, Any]


def declared_tools(tools: list[dict] | None) -> Tools:
    """name → parameters schema, from OpenAI tools ({"type": "function", "function": {...}}) or bare functions."""
    out: dict[str, Any] = {}
    for tool in tools or []:
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        name = fn.get("name")
        if isinstance(name, str):
            out[name] = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    return out


def call_from_obj(obj: Any) -> Optional[Call]:
    """A JSON value written as a call ({"name", "arguments"|"parameters"}, or OpenAI's wrapped form)."""
    if not isinstance(obj, dict):
        return None
    if "name" not in obj and isinstance(obj.get("function"), dict):  # {"type": "function", "function": {...}}
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    args = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    if args is None or args == [] or (isinstance(args, str) and not args.strip()):
        args = {}  # [] is how small models write "no arguments" (Qwen 0.5B, Codex's MCP test: 1 turn in 12)
    if isinstance(args, str):
        parsed, args = try_loads(args)  # bounded depth: the model's text is no more trusted than a client's
        if not parsed:
            return None
    if not isinstance(args, dict):
        return None
    return name.strip(), args


class Verdict(Enum):
    CALLS = "calls"  # well-formed calls to declared tools
    UNDECLARED = "undeclared"  # well-formed, but a call names a tool that was not offered: stays content
    INVALID = "invalid"  # not a call at all: the markup is dropped


@dataclass(frozen=True)
class Judged:
    verdict: Verdict
    calls: list[Call] = field(default_factory=list)


def declared_name(name: str, tools: Tools) -> Optional[str]:
    """The declared tool a call names: its exact name, else the one tool whose name differs only in
    case (small models write `Write` for opencode's `write`, `Read` for `read`), else None."""
    if name in tools:
        return name
    folded = [t for t in tools if t.casefold() == name.casefold()]
    return folded[0] if len(folded) == 1 else None


def judge(calls: list[Optional[Call]], tools: Tools) -> Judged:
    if not calls or any(c is None for c in calls):
        return Judged(Verdict.INVALID)
    named = [(declared_name(name, tools), args) for name, args in calls]  # type: ignore[misc]
    if any(name is None for name, _ in named):
        return Judged(Verdict.UNDECLARED)
    return Judged(Verdict.CALLS, named)  # type: ignore[arg-type]


# What the scanner decides a stretch of text is.
@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Calls:
    calls: list[Call]


@dataclass(frozen=True)
class Drop:
    """Broken call markup: neither content nor a call."""


Segment = Union[Text, Calls, Drop]


def segments_of(judged: Judged, raw: str) -> list[Segment]:
    """A construct's verdict as what the scanner emits: calls, its raw text, or nothing."""
    if judged.verdict is Verdict.CALLS:
        return [Calls(judged.calls)]
    if judged.verdict is Verdict.UNDECLARED:
        return [Text(raw)]
    return [Drop()]


# A format's reader for the construct starting with its marker at buf[p]:
# (segments, end) once decided, or None while more text may change the decision.
BlockReader = Callable[[str, int, bool, Tools], Optional[tuple[list[Segment], int]]]
