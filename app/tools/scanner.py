"""The one scanner over model output: finds every registered format's markers and lets the
format's reader decide each construct. Used whole (`final=True`) and streamed (`final=False`).

Decisions (the lead should know):
- A construct whose calls are well formed but name an undeclared tool stays content, verbatim (tags
  included). If one call of a block names an undeclared tool, the whole block stays content.
- Broken markup is dropped, prose around it kept: a `<tool_call>` block holding invalid JSON or no call
  shape, a `<tool_call>` / `<function=` left open at the end of output, a stray `</tool_call>`, and
  (output cut short by max_tokens only) a marker's first characters at the very end (`<tool_`).
  Exception: an unclosed `<tool_call>` (or fence) at the end whose body is nonetheless a complete JSON call
  (or complete `<function=...>...</function>` blocks) is accepted: the model stopped right before its
  closing tag. Inside a closed block a missing `</function>` / `</parameter>` is tolerated.
- With final=False only decisions no continuation of the text could change are made, so the folded
  stream equals the whole-text result. Output beginning with `{"` / `[{` is held while it may still be
  a bare JSON call (until it is complete JSON followed by more text, or provably invalid, or the end).
"""

from __future__ import annotations

import re

from .calls import Calls, Segment, Text, Tools
from .formats import READERS
from .formats.json_call import Bare, read_bare

MARKERS = tuple(READERS)
_MARKER_RE = re.compile("|".join(re.escape(m) for m in MARKERS))


def _partial_marker_len(s: str) -> int:
    """Length of the longest suffix of `s` that is a proper prefix of a marker."""
    best = 0
    for m in MARKERS:
        for n in range(min(len(m) - 1, len(s)), best, -1):
            if s.endswith(m[:n]):
                best = n
                break
    return best


def scan(buf: str, tools: Tools, *, final: bool, at_start: bool,
         cut: bool = False) -> tuple[list[Segment], int, bool]:
    """Decide what a prefix of `buf` is. Returns (segments, how much of buf they cover, still at start).
    `cut` (with final): the output was cut short (max_tokens), so a marker begun at its very end
    (`<tool_` of `<tool_call>`) is unfinished markup, dropped as an unfinished block is."""
    out: list[Segment] = []
    if at_start:
        stripped = buf.lstrip()
        if not stripped:
            if final:
                return ([Text(buf)] if buf else []), len(buf), False
            return [], 0, True
        if stripped[0] in "{[":
            kind, calls = read_bare(stripped, final, tools)
            if kind is Bare.WAIT:
                return [], 0, True
            if kind is Bare.CALLS:
                return [Text(buf[:len(buf) - len(stripped)]), Calls(calls)], len(buf), False
        at_start = False
    i = 0
    while i < len(buf):
        m = _MARKER_RE.search(buf, i)
        if m is None:
            # a marker's beginning at the end: held back while streaming, dropped when cut short
            tail = _partial_marker_len(buf[i:]) if not final or cut else 0
            if len(buf) - tail > i:
                out.append(Text(buf[i:len(buf) - tail]))
            i = len(buf) if final else len(buf) - tail
            break
        p = m.start()
        if p > i:
            out.append(Text(buf[i:p]))
            i = p
        res = READERS[m.group()](buf, p, final, tools)
        if res is None:
            break
        segs, i = res
        out.extend(segs)
    return out, i, at_start
