"""Tool calls in model output, whole-text and streamed, over one scanner (scanner.py) and the
registered formats (formats/): Hermes `<tool_call>` blocks, Qwen XML functions, bare or fenced JSON.
Only when tools were offered; otherwise the text is content, unchanged.

- Content: when there are calls, trailing whitespace of the content is dropped (so whitespace-only
  content becomes ""); otherwise the text is untouched. The stream holds trailing whitespace back.
- `parallel=False`: later calls are dropped entirely (neither calls nor content).
- Streaming: a call is emitted (start + arguments in one fragment) once its construct is decided.
"""

from __future__ import annotations

import json

from .calls import (
    Calls,
    ContentDelta,
    Delta,
    ParsedOutput,
    Text,
    ToolArgumentsDelta,
    ToolCall,
    ToolCallStart,
    declared_tools,
    new_call_id,
)
from .scanner import scan


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

    def finish(self, *, cut: bool = False) -> list[Delta]:
        """The rest, decided. `cut`: the output was cut short (max_tokens): see scanner.scan."""
        if self._done:
            return []
        self._done = True
        if not self._tools:
            return []
        out = self._run(final=True, cut=cut)
        if self._held_ws and not self._calls:
            out.append(ContentDelta(self._held_ws))
        self._held_ws = ""
        return out

    def _run(self, final: bool, cut: bool = False) -> list[Delta]:
        segs, used, self._at_start = scan(self._buf, self._tools, final=final, at_start=self._at_start, cut=cut)
        self._buf = self._buf[used:]
        out: list[Delta] = []
        for seg in segs:
            if isinstance(seg, Text):
                text = self._held_ws + seg.text
                body = text.rstrip()
                self._held_ws = text[len(body):]
                if body:
                    out.append(ContentDelta(body))
            elif isinstance(seg, Calls):
                for name, args in seg.calls:
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


def parse_tool_calls(text: str, tools: list[dict] | None, *, parallel: bool = True,
                     cut: bool = False) -> ParsedOutput:
    """The whole output → content and tool calls (`cut`: it was cut short, see scanner.scan)."""
    declared = declared_tools(tools)
    if not declared:
        return ParsedOutput(text, [])
    segs, _, _ = scan(text, declared, final=True, at_start=True, cut=cut)
    content: list[str] = []
    calls: list[ToolCall] = []
    for seg in segs:
        if isinstance(seg, Text):
            content.append(seg.text)
        elif isinstance(seg, Calls):
            for name, args in seg.calls:
                if not parallel and calls:
                    break
                calls.append(ToolCall(new_call_id(), name, _args_json(args)))
    joined = "".join(content)
    return ParsedOutput(joined.rstrip() if calls else joined, calls)
