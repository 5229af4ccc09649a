"""Tool calls in model output: whole-text and streaming parsing over one scanner.

Recognised forms (only when tools were offered):

1. Hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; several blocks; a JSON list of
   calls (or several JSON values) in one block.
2. Qwen XML: `<function=NAME><parameter=P>value</parameter>...</function>`, inside `<tool_call>` or bare;
   values are typed by the tool's JSON schema (see `coerce.py`).
3. A bare JSON call `{"name": ..., "arguments"|"parameters": ...}` (or a list of them) that is the whole
   output, or a ```` ```json ```` / ```` ``` ```` fence whose body is such JSON (the fence may sit in prose).

Decisions (the lead should know):
- A construct whose calls are well formed but name an undeclared tool stays content, verbatim (tags
  included). If one call of a block names an undeclared tool, the whole block stays content.
- Broken markup is dropped, prose around it kept: a `<tool_call>` block holding invalid JSON or no call
  shape, a `<tool_call>` / `<function=` left open at the end of output, a stray `</tool_call>`.
  Exception: an unclosed `<tool_call>` (or fence) at the end whose body is nonetheless a complete JSON call
  (or complete `<function=...>...</function>` blocks) is accepted: the model stopped right before its
  closing tag. A `<tool_call>` followed by another `<tool_call>` before any `</tool_call>` ends there.
  Inside a closed block a missing `</function>` / `</parameter>` is tolerated (the value runs to the next
  tag or the end of the block).
- A fence that is not a call is ordinary content (its three backticks, then scanning resumes).
- Content: when there are calls, trailing whitespace of the content is dropped (so whitespace-only
  content becomes ""); otherwise the text is untouched. The stream holds trailing whitespace back.
- `parallel=False`: later calls are dropped entirely (neither calls nor content).
- No tools: the text is content, unchanged; the streaming parser passes it through.

Streaming: `StreamingToolParser` runs the same scanner over its undecided buffer with `final=False`; the
scanner only commits decisions that no later text can change, so the folded stream equals
`parse_tool_calls` on the whole text. A call is emitted (start + arguments in one fragment) once its
closing tag arrives. Output beginning with `{"` / `[{` is held while it may still be a bare JSON call
(until it is complete JSON followed by more text, or provably invalid JSON, or the end).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any, Union

from .coerce import coerce_value

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
FUNC_OPEN = "<function="
FUNC_CLOSE = "</function>"
PARAM_OPEN = "<parameter="
PARAM_CLOSE = "</parameter>"
FENCE = "```"
MARKERS = (TOOL_OPEN, TOOL_CLOSE, FUNC_OPEN, FENCE)
_MARKER_RE = re.compile("|".join(re.escape(m) for m in MARKERS))
# What a bare JSON call must start with; failing this on a prefix fails on every extension.
_BARE_START = re.compile(r'\{\s*(?:"|\Z)|\[\s*(?:\{\s*(?:"|\Z)|\Z)')
_DECODER = json.JSONDecoder()
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


def declared_tools(tools: list[dict] | None) -> dict[str, Any]:
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


# ---------------------------------------------------------------------------------------------- call bodies

_Calls = list[tuple[str, dict]]
# A parsed construct: ("calls", [(name, args)]) | ("undeclared", None) | ("invalid", None)
_Verdict = tuple[str, Any]


def _call_from_obj(obj: Any) -> tuple[str, dict] | None:
    if not isinstance(obj, dict):
        return None
    if "name" not in obj and isinstance(obj.get("function"), dict):  # {"type": "function", "function": {...}}
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    args = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    if args is None or (isinstance(args, str) and not args.strip()):
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return name.strip(), args


def _judge(calls: list[tuple[str, dict] | None], tools: dict[str, Any]) -> _Verdict:
    if not calls or any(c is None for c in calls):
        return ("invalid", None)
    if any(name not in tools for name, _ in calls):
        return ("undeclared", None)
    return ("calls", calls)


def _json_values(s: str) -> list[Any] | None:
    """One or more whitespace-separated JSON values making up all of `s`, or None."""
    s = s.strip()
    out, i = [], 0
    while i < len(s):
        try:
            value, i = _DECODER.raw_decode(s, i)
        except ValueError:
            return None
        out.append(value)
        while i < len(s) and s[i].isspace():
            i += 1
    return out or None


def _judge_json(values: list[Any] | None, tools: dict[str, Any]) -> _Verdict:
    if values is None:
        return ("invalid", None)
    calls: list[tuple[str, dict] | None] = []
    for v in values:
        if isinstance(v, list):
            calls.extend([_call_from_obj(x) for x in v] or [None])  # an empty list is no call
        else:
            calls.append(_call_from_obj(v))
    return _judge(calls, tools)


def _strip_one_newline(s: str) -> str:
    if s.startswith("\r\n"):
        s = s[2:]
    elif s.startswith("\n"):
        s = s[1:]
    if s.endswith("\r\n"):
        s = s[:-2]
    elif s.endswith("\n"):
        s = s[:-1]
    return s


def _xml_params(body: str, schema: dict) -> dict:
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    args: dict[str, Any] = {}
    pos = 0
    while (k := body.find(PARAM_OPEN, pos)) != -1:
        gt = body.find(">", k)
        if gt == -1:
            break
        name = body[k + len(PARAM_OPEN):gt].strip()
        start = gt + 1
        end = body.find(PARAM_CLOSE, start)
        nxt = body.find(PARAM_OPEN, start)
        if end == -1 or (nxt != -1 and nxt < end):  # unclosed parameter: ends at the next one
            end = nxt if nxt != -1 else len(body)
            pos = end
        else:
            pos = end + len(PARAM_CLOSE)
        args[name] = coerce_value(_strip_one_newline(body[start:end]), props.get(name))
    return args


def _judge_xml(text: str, tools: dict[str, Any], *, closed: bool = True) -> _Verdict:
    """Every `<function=NAME>...</function>` in `text`. In a closed `<tool_call>` block an unclosed last
    function runs to the end of the block; otherwise (closed=False) it is truncated, hence invalid."""
    calls: list[tuple[str, dict] | None] = []
    pos = 0
    while (k := text.find(FUNC_OPEN, pos)) != -1:
        gt = text.find(">", k)
        name = text[k + len(FUNC_OPEN):gt].strip() if gt != -1 else ""
        if gt == -1 or not name or "\n" in name or "<" in name:
            calls.append(None)
            break
        end = text.find(FUNC_CLOSE, gt)
        if end == -1 and not closed:
            calls.append(None)
            break
        body = text[gt + 1:end if end != -1 else len(text)]
        pos = end + len(FUNC_CLOSE) if end != -1 else len(text)
        calls.append((name, _xml_params(body, tools.get(name) or {})))
    return _judge(calls, tools)


def _judge_block(body: str, tools: dict[str, Any], *, closed: bool) -> _Verdict:
    if FUNC_OPEN in body:
        return _judge_xml(body, tools, closed=closed)
    return _judge_json(_json_values(body), tools)


# ---------------------------------------------------------------------------------------------- the scanner

# Segments: ("text", str) | ("calls", [(name, args)]) | ("drop", None)
_Seg = tuple[str, Any]


def _partial_marker_len(s: str) -> int:
    """Length of the longest suffix of `s` that is a proper prefix of a marker."""
    best = 0
    for m in MARKERS:
        for n in range(min(len(m) - 1, len(s)), best, -1):
            if s.endswith(m[:n]):
                best = n
                break
    return best


def _verdict_segments(verdict: _Verdict, raw: str) -> list[_Seg]:
    kind, calls = verdict
    if kind == "calls":
        return [("calls", calls)]
    if kind == "undeclared":
        return [("text", raw)]
    return [("drop", None)]


def _tool_block(buf: str, p: int, final: bool, tools: dict) -> tuple[list[_Seg], int] | None:
    start = p + len(TOOL_OPEN)
    close = buf.find(TOOL_CLOSE, start)
    nxt = buf.find(TOOL_OPEN, start)
    closed = close != -1 and (nxt == -1 or close < nxt)
    if closed:
        body, end = buf[start:close], close + len(TOOL_CLOSE)
    elif nxt != -1:
        body, end = buf[start:nxt], nxt
    elif final:
        body, end = buf[start:], len(buf)
    else:
        return None
    return _verdict_segments(_judge_block(body, tools, closed=closed), buf[p:end]), end


def _function_block(buf: str, p: int, final: bool, tools: dict) -> tuple[list[_Seg], int] | None:
    close = buf.find(FUNC_CLOSE, p)
    if close == -1:
        return None if not final else ([("drop", None)], len(buf))  # unclosed at the end: truncated
    end = close + len(FUNC_CLOSE)
    return _verdict_segments(_judge_xml(buf[p:end], tools), buf[p:end]), end


def _fence(buf: str, p: int, final: bool, tools: dict) -> tuple[list[_Seg], int] | None:
    not_call = ([("text", FENCE)], p + len(FENCE))
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
        verdict = _judge_json(_json_values(buf[j:]), tools)  # unclosed at the end: accept a complete call
        return ([("calls", verdict[1])], n) if verdict[0] == "calls" else not_call
    end = close + len(FENCE)
    verdict = _judge_json(_json_values(buf[j:close]), tools)
    if verdict[0] == "calls":
        return [("calls", verdict[1])], end
    if verdict[0] == "undeclared":
        return [("text", buf[p:end])], end
    return not_call


def _bare(buf: str, final: bool, tools: dict) -> tuple[str, Any]:
    """`buf` (stripped of leading whitespace) starts with { or [: ("calls", calls) | ("no", None) | ("wait", None)."""
    if not _BARE_START.match(buf):
        return ("no", None)
    try:
        value, end = _DECODER.raw_decode(buf)
    except json.JSONDecodeError as e:
        if final:
            return ("no", None)
        # Invalid for good if the decoder stuck well before the end (a partial token — number, literal,
        # escape — is at most 9 characters) and not in a string that may still be closed.
        if e.pos < len(buf) - 10 and not e.msg.startswith("Unterminated string"):
            return ("no", None)
        return ("wait", None)
    except RecursionError:
        return ("no", None)
    if buf[end:].strip():
        return ("no", None)
    verdict = _judge_json([value], tools)
    if verdict[0] != "calls":
        return ("no", None)
    return ("calls", verdict[1]) if final else ("wait", None)


def _scan(buf: str, tools: dict, *, final: bool, at_start: bool) -> tuple[list[_Seg], int, bool]:
    """Decide what a prefix of `buf` is. Returns (segments, how much of buf they cover, still at start).

    With final=False only decisions no continuation of `buf` could change are made.
    """
    out: list[_Seg] = []
    if at_start:
        stripped = buf.lstrip()
        if not stripped:
            if final:
                return ([("text", buf)] if buf else []), len(buf), False
            return [], 0, True
        if stripped[0] in "{[":
            kind, calls = _bare(stripped, final, tools)
            if kind == "wait":
                return [], 0, True
            if kind == "calls":
                return [("text", buf[:len(buf) - len(stripped)]), ("calls", calls)], len(buf), False
        at_start = False
    i = 0
    while i < len(buf):
        m = _MARKER_RE.search(buf, i)
        if m is None:
            keep = 0 if final else _partial_marker_len(buf[i:])
            if len(buf) - keep > i:
                out.append(("text", buf[i:len(buf) - keep]))
            i = len(buf) - keep
            break
        p = m.start()
        if p > i:
            out.append(("text", buf[i:p]))
            i = p
        marker = m.group()
        if marker == TOOL_CLOSE:  # stray closing tag
            out.append(("drop", None))
            i = p + len(TOOL_CLOSE)
            continue
        handler = {TOOL_OPEN: _tool_block, FUNC_OPEN: _function_block, FENCE: _fence}[marker]
        res = handler(buf, p, final, tools)
        if res is None:
            break
        segs, i = res
        out.extend(segs)
    return out, i, at_start


# ---------------------------------------------------------------------------------------------- public API

def _args_json(args: dict) -> str:
    return json.dumps(args, ensure_ascii=False)


class StreamingToolParser:
    """Text deltas in, content / tool-call deltas out (OpenAI's incremental form)."""

    def __init__(self, tools: list[dict] | None, *, parallel: bool = True):
        self._tools = declared_tools(tools)
        self._parallel = parallel
        self._buf = ""
        self._at_start = True
        self._held_ws = ""  # trailing whitespace of released content
        self._calls = 0
        self._done = False

    @property
    def has_tool_calls(self) -> bool:
        return self._calls > 0

    def push(self, text: str) -> list[Delta]:
        if not self._tools:
            return [ContentDelta(text)] if text else []
        self._buf += text
        return self._run(final=False)

    def finish(self) -> list[Delta]:
        if self._done:
            return []
        self._done = True
        if not self._tools:
            return []
        out = self._run(final=True)
        if self._held_ws and not self._calls:
            out.append(ContentDelta(self._held_ws))
        self._held_ws = ""
        return out

    def _run(self, final: bool) -> list[Delta]:
        segs, used, self._at_start = _scan(self._buf, self._tools, final=final, at_start=self._at_start)
        self._buf = self._buf[used:]
        out: list[Delta] = []
        for kind, value in segs:
            if kind == "text":
                text = self._held_ws + value
                body = text.rstrip()
                self._held_ws = text[len(body):]
                if body:
                    out.append(ContentDelta(body))
            elif kind == "calls":
                for name, args in value:
                    if not self._parallel and self._calls:
                        break
                    index = self._calls
                    self._calls += 1
                    out.append(ToolCallStart(index, new_call_id(), name))
                    out.append(ToolArgumentsDelta(index, _args_json(args)))
        return _merge_content(out)


def _merge_content(deltas: list[Delta]) -> list[Delta]:
    out: list[Delta] = []
    for d in deltas:
        if isinstance(d, ContentDelta) and out and isinstance(out[-1], ContentDelta):
            out[-1] = ContentDelta(out[-1].text + d.text)
        else:
            out.append(d)
    return out


def fold(deltas: list[Delta]) -> ParsedOutput:
    """Deltas (from one parser) → the whole output they describe."""
    content: list[str] = []
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if isinstance(d, ContentDelta):
            content.append(d.text)
        elif isinstance(d, ToolCallStart):
            calls[d.index] = [d.id, d.name, ""]
        else:
            calls[d.index][2] += d.fragment
    return ParsedOutput("".join(content), [ToolCall(*calls[i]) for i in sorted(calls)])


def parse_tool_calls(text: str, tools: list[dict] | None, *, parallel: bool = True) -> ParsedOutput:
    """The whole output → content and tool calls."""
    declared = declared_tools(tools)
    if not declared:
        return ParsedOutput(text, [])
    segs, _, _ = _scan(text, declared, final=True, at_start=True)
    content: list[str] = []
    calls: list[ToolCall] = []
    for kind, value in segs:
        if kind == "text":
            content.append(value)
        elif kind == "calls":
            for name, args in value:
                if not parallel and calls:
                    break
                calls.append(ToolCall(new_call_id(), name, _args_json(args)))
    joined = "".join(content)
    return ParsedOutput(joined.rstrip() if calls else joined, calls)
