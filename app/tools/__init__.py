"""Tool calls: parsing model output (whole or streamed) and prompting models without tool templates."""

from .parser import (
    ContentDelta,
    Delta,
    ParsedOutput,
    StreamingToolParser,
    ToolArgumentsDelta,
    ToolCall,
    ToolCallStart,
    fold,
    parse_tool_calls,
)
from .prompt import template_supports_tools, tools_system_prompt

__all__ = [
    "ContentDelta", "Delta", "ParsedOutput", "StreamingToolParser", "ToolArgumentsDelta", "ToolCall",
    "ToolCallStart", "fold", "parse_tool_calls", "template_supports_tools", "tools_system_prompt",
]
