"""Tool calls: parsing model output (whole or streamed) over one format registry (formats/), and
prompting models whose chat template has no tool support."""

from .calls import ContentDelta, Delta, ParsedOutput, ToolArgumentsDelta, ToolCall, ToolCallStart
from .formats import hermes
from .parser import StreamingToolParser, fold, parse_tool_calls
from .prompt import calls_as_text, template_supports_tools, tools_system_prompt, with_tools_system_prompt

__all__ = [
    "ContentDelta", "Delta", "ParsedOutput", "StreamingToolParser", "ToolArgumentsDelta", "ToolCall",
    "ToolCallStart", "calls_as_text", "fold", "hermes", "parse_tool_calls", "template_supports_tools",
    "tools_system_prompt", "with_tools_system_prompt",
]
