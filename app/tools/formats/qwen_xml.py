"""Qwen's XML calls: `<function=NAME><parameter=P>value</parameter>...</function>`, inside a
`<tool_call>` block or bare. Values are typed by the tool's JSON schema (`coerce.py`)."""

from __future__ import annotations

from typing import Any, Optional

from ..calls import Call, Drop, Judged, Segment, Tools, declared_name, judge, segments_of
from ..coerce import coerce_value

FUNC_OPEN = "<function="
FUNC_CLOSE = "</function>"
PARAM_OPEN = "<parameter="
PARAM_CLOSE = "</parameter>"


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


def _params(body: str, schema: dict) -> dict:
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


def judge_xml(text: str, tools: Tools, *, closed: bool = True) -> Judged:
    """Every `<function=NAME>...</function>` in `text`. In a closed `<tool_call>` block an unclosed last
    function runs to the end of the block; otherwise (closed=False) it is truncated, hence invalid."""
    calls: list[Optional[Call]] = []
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
        calls.append((name, _params(body, tools.get(declared_name(name, tools) or name) or {})))
    return judge(calls, tools)


def read_function(buf: str, p: int, final: bool, tools: Tools) -> Optional[tuple[list[Segment], int]]:
    """A bare `<function=...>` block at buf[p]."""
    close = buf.find(FUNC_CLOSE, p)
    if close == -1:
        return None if not final else ([Drop()], len(buf))  # unclosed at the end: truncated
    end = close + len(FUNC_CLOSE)
    return segments_of(judge_xml(buf[p:end], tools), buf[p:end]), end


READERS = {FUNC_OPEN: read_function}
