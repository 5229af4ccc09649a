"""Requests' ways of asking a model to think, or not, as chat-template variables.

Clients ask in several dialects: OpenAI's `reasoning_effort` (chat) and `reasoning.effort`
(Responses), Qwen's and DashScope's top-level `enable_thinking`, and `thinking: {"type": ...}`
(DeepSeek's and Z.ai's, as Anthropic's Messages API has it). Templates that can think read
`enable_thinking` (Qwen3, SmolLM3, DeepSeek-R1 distills ignore it and always think); gpt-oss's
reads `reasoning_effort`. So an effort is passed as it is, and "none" or "minimal" also turns
thinking off; a higher effort leaves thinking as the template and --no-think have it (an agent
sends one by default, and must not undo the operator's --no-think). A template that reads neither
is unaffected, as it is by a `chat_template_kwargs` it does not read.
"""

from __future__ import annotations

from typing import Any

from .errors import invalid_value

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def effort_kwargs(effort: Any, param: str) -> dict[str, Any]:
    """Template variables for a reasoning effort (None: none asked)."""
    if effort is None:
        return {}
    if effort not in EFFORTS:
        raise invalid_value(param, f"'{param}' must be one of {', '.join(EFFORTS)}")
    off = {"enable_thinking": False} if effort in ("none", "minimal") else {}
    return {"reasoning_effort": effort, **off}


def switch_kwargs(enable_thinking: Any, thinking: Any) -> dict[str, Any]:
    """Template variables for a top-level `enable_thinking` (bool) or `thinking: {"type": ...}`."""
    out: dict[str, Any] = {}
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "disabled", "auto", "adaptive"):
            raise invalid_value("thinking.type", "'thinking.type' must be 'enabled', 'disabled', 'auto' or 'adaptive'")
        if kind in ("enabled", "disabled"):
            out["enable_thinking"] = kind == "enabled"
    if enable_thinking is not None:
        if not isinstance(enable_thinking, bool):
            raise invalid_value("enable_thinking", "'enable_thinking' must be a boolean")
        out["enable_thinking"] = enable_thinking
    return out
