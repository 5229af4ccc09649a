"""The Messages API request: parsed, validated, and put in the chat route's message convention.

Anthropic's content blocks become the HF chat-template messages the chat route renders:
`system` (a string or text blocks, and any `role: "system"` message inside `messages`) is
one leading system message; `tool_use` blocks are an assistant turn's `tool_calls` (arguments
as an object); each `tool_result` block is a `tool` message; `thinking` goes back as the
assistant turn's `reasoning_content`. Custom tools become OpenAI function tools; server tools
(`web_search_…`, `bash_…`, …) are accepted and left out.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from app import validation
from app.engine import SamplingParams
from app.engine.sessions import MAX_SESSION_ID_CHARS
from app.http.chat import MAX_MESSAGES, ResponseFormat
from app.http.errors import APIError, invalid_value
from app.http.fields import Fields, message_list
from app.http.generation_params import GenerationParams, stop_strings
from app.text.unread import placeholder

log = logging.getLogger("etserve")

# Accepted, and they change nothing here (bookkeeping, prompt caching, routing, Claude Code's
# context editing): refusing them would break clients that always send them.
IGNORED_FIELDS = ("metadata", "service_tier", "cache_control", "context_management", "inference_geo", "speed",
                  "diagnostics", "user_profile_id", "workspace_id", "betas", "container")
# Known fields this server cannot honour: refused by name when set.
NOT_SUPPORTED = ("mcp_servers",)
# Blocks the model cannot read (it reads text only): a short placeholder, and a warning in the log
# (a document of plain text is read as text). Claude Code sends images when a user pastes one and
# in tool results (its Read tool on an image): refusing them would end the conversation.
PLACEHOLDER_BLOCKS = ("image", "document")
# What server tools (which this server does not run) did in a conversation begun elsewhere: a note.
SERVER_TOOL_BLOCKS = ("server_tool_use", "mcp_tool_use", "web_search_tool_result", "web_fetch_tool_result",
                      "code_execution_tool_result", "bash_code_execution_tool_result",
                      "text_editor_code_execution_tool_result", "tool_search_tool_result", "mcp_tool_result",
                      "container_upload", "tool_reference")
MAX_TOOL_NAME = 128
_logged_server_tools: set[str] = set()  # logged once each; bounded, as a client picks the names
MAX_LOGGED_TOOL_TYPES = 64


@dataclass(frozen=True)
class MessagesRequest:
    model: str | None
    messages: list[dict[str, Any]]  # the chat route's convention (see the module docstring)
    max_tokens: int | None  # None only for count_tokens
    params: GenerationParams  # params.max_tokens is None: the context decides, then max_tokens clamps
    stream: bool
    tools: list[dict[str, Any]] | None  # OpenAI function tools
    tool_choice: str  # the chat route's: "auto", "none", "required", "function"
    forced_tool: str | None
    parallel_tool_calls: bool
    response_format: ResponseFormat | None  # output_config.format
    template_kwargs: dict[str, Any]
    session_id: str | None = None  # from metadata.user_id, else a session header
    thinking_budget: int | None = None  # thinking.budget_tokens: the most tokens the thinking may take


def parse_messages_request(body: Any) -> MessagesRequest:
    return _parse(body, counting=False)


def parse_count_tokens_request(body: Any) -> MessagesRequest:
    """count_tokens takes the same body; `max_tokens` is optional there."""
    return _parse(body, counting=True)


def _parse(body: Any, *, counting: bool) -> MessagesRequest:
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_request")
    f = Fields(body)
    model = f.string("model", None)
    max_tokens = f.integer("max_tokens", None, lo=0)  # 0: read the prompt into the cache, write nothing
    if max_tokens is None and not counting:
        raise APIError(400, "'max_tokens' is required", code="missing_required_parameter", param="max_tokens")
    system = _system_text("system", f.raw("system"), strip_billing=True)
    inner_system, messages = _messages(f.raw("messages"))
    system_text = "\n\n".join(t for t in [system, *inner_system] if t)
    if system_text:
        messages = [{"role": "system", "content": system_text}, *messages]
    sampling = SamplingParams(
        temperature=f.number("temperature", 1.0, lo=0.0, hi=1.0),
        top_p=f.number("top_p", 1.0, lo=0.0, hi=1.0),
        top_k=f.integer("top_k", 0, lo=0),
    )
    params = GenerationParams(sampling=sampling, max_tokens=None, stop=_stop_sequences(f.raw("stop_sequences")))
    stream = f.boolean("stream", False)
    tools = _tools(f.array("tools"))
    tool_choice, forced_tool, parallel = _tool_choice(f.raw("tool_choice"), tools)
    if tool_choice == "none":
        tools = None  # the model sees no tools
    response_format = _output_config(f.obj("output_config"))
    thinking = f.obj("thinking")
    template_kwargs = _thinking(thinking, max_tokens)
    thinking_budget = thinking.get("budget_tokens") if thinking and thinking.get("type") == "enabled" else None
    session_id = _session_from_metadata(f.raw("metadata"))
    for name in IGNORED_FIELDS:
        f.raw(name)
    for name in NOT_SUPPORTED:
        if f.raw(name) not in (None, [], False):
            raise invalid_value(name, f"'{name}' is not supported by this server")
    f.reject_unknown()
    return MessagesRequest(model=model, messages=messages, max_tokens=max_tokens, params=params, stream=stream,
                           tools=tools, tool_choice=tool_choice, forced_tool=forced_tool,
                           parallel_tool_calls=parallel, response_format=response_format,
                           template_kwargs=template_kwargs, session_id=session_id, thinking_budget=thinking_budget)


def _blocks(where: str, content: Any) -> list[dict[str, Any]]:
    """Content as a list of typed blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise invalid_value(where, f"'{where}' must be a string or an array of content blocks")
    out = []
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise invalid_value(f"{where}[{j}]", f"'{where}[{j}]' must be a content block with a string 'type'")
        kind = block["type"]
        if kind in PLACEHOLDER_BLOCKS:
            source = block.get("source")
            if not isinstance(source, dict) or source.get("type") not in ("base64", "url", "file", "text",
                                                                          "content"):
                raise invalid_value(f"{where}[{j}]", f"an {kind} block needs a 'source' object "
                                                     "(base64, url, file or text)")
            block = {"type": "text", "text": _placeholder(kind, block)}
        elif kind == "search_result":
            block = {"type": "text", "text": _search_result_text(f"{where}[{j}]", block)}
        out.append(block)
    return out


def _search_result_text(where: str, block: dict[str, Any]) -> str:
    """A search_result block (title, source, content: text blocks) as the text the model reads."""
    content = block.get("content")
    if not isinstance(content, list):
        raise invalid_value(f"{where}.content", f"'{where}.content' must be an array of text blocks")
    texts = []
    for k, c in enumerate(content):
        if not isinstance(c, dict) or not isinstance(c.get("text"), str):
            raise invalid_value(f"{where}.content[{k}]", f"'{where}.content[{k}]' must be a text block with a string 'text'")
        texts.append(c["text"])
    title = block.get("title")
    if title is not None and not isinstance(title, str):
        raise invalid_value(f"{where}.title", f"'{where}.title' must be a string")
    return "\n".join([title or "", *texts]).strip()


def _placeholder(kind: str, block: dict[str, Any]) -> str:
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    if kind == "document" and source.get("type") == "text" and isinstance(source.get("data"), str):
        title = block.get("title")
        return (f"{title}\n" if isinstance(title, str) and title else "") + source["data"]
    title = block.get("title") if kind == "document" else None
    return placeholder("messages", kind, kind, title if isinstance(title, str) and title else None)


def _server_tool_note(kind: str, block: dict[str, Any]) -> str:
    detail = block.get("name") or block.get("input") or ""
    text = json.dumps(detail)[:300] if detail and not isinstance(detail, str) else str(detail)[:300]
    return f"[{kind}{': ' + text if text else ''}]"


def _text(where: str, block: dict[str, Any]) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise invalid_value(f"{where}.text", "a text block needs a string 'text'")
    return text


# Claude Code's first system block: client telemetry for Anthropic's billing, not instructions. Its
# version suffix (and, in some versions, a `cch=` nonce) is derived from the request, so kept
# at the head of the prompt it would make every turn's prompt differ from the cached one there.
_BILLING_HEADER = re.compile(r"\Ax-anthropic-billing-header:[^\n]*\n?")


def _system_text(where: str, value: Any, *, strip_billing: bool = False) -> str:
    """`system` (or a system message's content): a string or text blocks (cache_control ignored);
    with `strip_billing`, without a leading x-anthropic-billing-header line."""
    if value is None:
        return ""
    parts = []
    if isinstance(value, list):
        for j, block in enumerate(value):
            if isinstance(block, dict) and block.get("type") != "text":
                raise invalid_value(f"{where}[{j}]",
                                    f"system content takes text blocks only, not {block.get('type')!r}")
    for j, block in enumerate(_blocks(where, value)):
        if block["type"] != "text":
            raise invalid_value(f"{where}[{j}]", f"system content takes text blocks only, not {block['type']!r}")
        text = _text(f"{where}[{j}]", block)
        parts.append(_BILLING_HEADER.sub("", text) if strip_billing else text)
    return "\n\n".join(p for p in parts if p)


def _messages(value: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """(system texts found inside `messages`, the other turns in the chat convention)."""
    value = message_list(value, MAX_MESSAGES)
    system: list[str] = []
    out: list[dict[str, Any]] = []
    tool_names: dict[str, str] = {}  # tool_use id -> tool name, for the tool messages that answer it
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid_value(where, f"'{where}' must be an object")
        role = m.get("role")
        if "content" not in m:
            raise invalid_value(f"{where}.content", f"'{where}.content' is required")
        if role in ("system", "developer"):  # Claude Code sends one after the user turn: it is system text
            system.append(_system_text(f"{where}.content", m["content"]))
        elif role == "user":
            out.extend(_user_turn(where, m["content"], tool_names))
        elif role == "assistant":
            out.append(_assistant_turn(where, m["content"], tool_names))
        else:
            raise invalid_value(f"{where}.role", f"'{where}.role' must be 'user' or 'assistant'")
    out = _combined(out)
    if not out:
        raise invalid_value("messages", "'messages' needs at least one user or assistant message")
    last = out[-1]
    if last["role"] == "assistant" and not last.get("tool_calls") and last["content"] != last["content"].rstrip():
        # a prefill the model continues (app/http/chat.py): as Anthropic, not after whitespace,
        # which would leave the model a token boundary it never saw in training
        raise invalid_value(f"messages[{len(value) - 1}].content",
                            "final assistant content cannot end with trailing whitespace")
    return system, out


def _combined(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive user turns, and consecutive assistant turns, as one (the Messages API's rule:
    "consecutive user or assistant turns will be combined into a single turn"); so two assistant
    messages at the end are one prefill. An assistant turn that made tool calls ends its turn."""
    out: list[dict[str, Any]] = []
    for turn in turns:
        last = out[-1] if out else None
        if last is not None and turn["role"] == last["role"] == "user":
            last["content"] = "\n\n".join(t for t in (last["content"], turn["content"]) if t)
        elif last is not None and turn["role"] == last["role"] == "assistant" and not last.get("tool_calls"):
            merged = {"role": "assistant", "content": (last["content"] or "") + (turn["content"] or "")}
            if turn.get("tool_calls"):
                merged["tool_calls"] = turn["tool_calls"]
                merged["content"] = merged["content"] or None
            reasoning = [r for r in (last.get("reasoning_content"), turn.get("reasoning_content")) if r]
            if reasoning:
                merged["reasoning_content"] = "\n\n".join(reasoning)
            out[-1] = merged
        else:
            out.append(dict(turn))
    return out


def _user_turn(where: str, content: Any, tool_names: dict[str, str]) -> list[dict[str, Any]]:
    """A user turn: its tool results as `tool` messages, then its text as a user message."""
    where = f"{where}.content"
    tools, texts, only_results = [], [], isinstance(content, list) and bool(content)
    for j, block in enumerate(_blocks(where, content)):
        kind, at = block["type"], f"{where}[{j}]"
        if kind == "text":
            texts.append(_text(at, block))
            only_results = False
        elif kind == "tool_result":
            tools.append(_tool_result(at, block, tool_names))
        elif kind in ("thinking", "redacted_thinking"):
            continue
        elif kind == "container_upload":
            texts.append(_server_tool_note(kind, block))
            only_results = False
        else:
            raise invalid_value(at, f"a user message cannot hold a {kind!r} block")
    if only_results:
        return tools
    return [*tools, {"role": "user", "content": "\n\n".join(texts)}]


def _tool_result(where: str, block: dict[str, Any], tool_names: dict[str, str]) -> dict[str, Any]:
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str):
        raise invalid_value(f"{where}.tool_use_id", "a tool_result block needs a string 'tool_use_id'")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise invalid_value(f"{where}.is_error", "'is_error' must be a boolean")
    content = block.get("content", "")
    texts = []
    for j, part in enumerate(_blocks(f"{where}.content", content)):
        if part["type"] == "tool_reference":
            part = {"type": "text", "text": _server_tool_note("tool_reference", part)}
        if part["type"] != "text":
            raise invalid_value(f"{where}.content[{j}]", f"a tool result holds text blocks, not {part['type']!r}")
        texts.append(_text(f"{where}.content[{j}]", part))
    text = "\n\n".join(texts)
    message = {"role": "tool", "tool_call_id": tool_use_id, "content": f"Error: {text}" if is_error else text}
    if tool_use_id in tool_names:
        message["name"] = tool_names[tool_use_id]
    return message


def _assistant_turn(where: str, content: Any, tool_names: dict[str, str]) -> dict[str, Any]:
    where = f"{where}.content"
    texts, thinking, calls = [], [], []
    for j, block in enumerate(_blocks(where, content)):
        kind, at = block["type"], f"{where}[{j}]"
        if kind == "text":
            texts.append(_text(at, block))
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise invalid_value(f"{at}.thinking", "a thinking block needs a string 'thinking'")
            thinking.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # encrypted elsewhere; nothing this model can read
        elif kind == "tool_use":
            calls.append(_tool_use(at, block, tool_names))
        elif kind in SERVER_TOOL_BLOCKS and kind not in ("container_upload", "tool_reference"):
            texts.append(_server_tool_note(kind, block))  # a server tool ran where the conversation began
        else:
            raise invalid_value(at, f"an assistant message cannot hold a {kind!r} block")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    if any(thinking):
        message["reasoning_content"] = "\n\n".join(t for t in thinking if t)
    return message


def _tool_use(where: str, block: dict[str, Any], tool_names: dict[str, str]) -> dict[str, Any]:
    id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(id, str) or not isinstance(name, str):
        raise invalid_value(where, "a tool_use block needs a string 'id' and 'name'")
    if not isinstance(arguments, dict):
        raise invalid_value(f"{where}.input", "a tool_use block's 'input' must be an object")
    tool_names[id] = name
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _stop_sequences(value: Any) -> tuple[str, ...]:
    return stop_strings(value, "stop_sequences", one_string=False)


def _tools(value: list[Any] | None) -> list[dict[str, Any]] | None:
    """Custom tools as OpenAI function tools; server tools (any other `type`) left out."""
    out, names = [], set()
    for i, tool in enumerate(value or ()):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid_value(where, f"'{where}' must be an object")
        kind = tool.get("type", "custom")
        if kind is None:
            kind = "custom"
        if not isinstance(kind, str):
            raise invalid_value(f"{where}.type", "a tool's 'type' must be a string")
        if kind != "custom":  # a server tool (web_search_20250305, bash_20250124, ...): nothing runs it here
            if kind not in _logged_server_tools and len(_logged_server_tools) < MAX_LOGGED_TOOL_TYPES:
                _logged_server_tools.add(kind[:64])  # clients choose these names: kept few and short
                log.info("server tool type %r is accepted and left out of the prompt", kind[:64])
            continue
        name, schema, description = tool.get("name"), tool.get("input_schema"), tool.get("description")
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_TOOL_NAME:
            raise invalid_value(f"{where}.name", f"each tool needs a 'name' of 1 to {MAX_TOOL_NAME} characters")
        if name in names:
            raise invalid_value(f"{where}.name", f"the tool name {name!r} appears twice")
        if not isinstance(schema, dict):
            raise invalid_value(f"{where}.input_schema", "each tool needs an 'input_schema' object")
        if description is not None and not isinstance(description, str):
            raise invalid_value(f"{where}.description", "a tool's 'description' must be a string")
        names.add(name)
        function = {"name": name, "parameters": schema}
        if description:
            function["description"] = description
        out.append({"type": "function", "function": function})
    return out or None


def _tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> tuple[str, str | None, bool]:
    """(the chat route's tool_choice, the forced tool's name or None, parallel tool calls)."""
    if value is None:
        return "auto", None, True
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise invalid_value("tool_choice", "tool_choice must be an object whose 'type' is 'auto', 'any', 'tool' "
                            "or 'none'")
    disable_parallel = value.get("disable_parallel_tool_use", False)
    if not isinstance(disable_parallel, bool):
        raise invalid_value("tool_choice.disable_parallel_tool_use", "'disable_parallel_tool_use' must be a boolean")
    parallel = not disable_parallel
    if kind in ("auto", "none"):
        return kind, None, parallel
    if not tools:
        raise invalid_value("tool_choice", f"tool_choice {kind!r} needs at least one custom tool in 'tools'")
    if kind == "any":
        return "required", None, parallel
    name = value.get("name")
    if not isinstance(name, str):
        raise invalid_value("tool_choice.name", "tool_choice 'tool' needs a string 'name'")
    if name not in {t["function"]["name"] for t in tools}:
        raise invalid_value("tool_choice.name", f"tool_choice names the tool {name!r}, which is not in 'tools'")
    return "function", name, False


def _output_config(value: dict[str, Any] | None) -> ResponseFormat | None:
    """`effort` is accepted and changes nothing; `format` (a JSON schema) is enforced as response_format."""
    fmt = (value or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise invalid_value("output_config.format", "output_config.format must be {\"type\": \"json_schema\", "
                            "\"schema\": {...}}")
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise invalid_value("output_config.format.schema", "output_config.format needs a 'schema' object")
    return ResponseFormat(schema=schema)


MIN_THINKING_BUDGET = 1024  # the Messages API's least budget_tokens


def _thinking(value: dict[str, Any] | None, max_tokens: int | None) -> dict[str, Any]:
    """Template kwargs for `thinking`: "disabled" turns a thinking template's reasoning off,
    "enabled" on; "adaptive" leaves the model (and --no-think) to decide. "enabled" takes a
    `budget_tokens` of at least 1024 and below `max_tokens`, as the Messages API requires."""
    if value is None:
        return {}
    kind = value.get("type")
    if kind not in ("enabled", "disabled", "adaptive"):
        raise invalid_value("thinking.type", "thinking.type must be 'enabled', 'disabled' or 'adaptive'")
    if kind == "adaptive":
        return {}
    if kind == "enabled":
        budget = value.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int):
            raise invalid_value("thinking.budget_tokens", "thinking.enabled.budget_tokens: Field required "
                                                          "(an integer of at least 1024)")
        if budget < MIN_THINKING_BUDGET:
            raise invalid_value("thinking.budget_tokens", "thinking.enabled.budget_tokens: Input should be "
                                                          f"greater than or equal to {MIN_THINKING_BUDGET}")
        if max_tokens is not None and budget >= max_tokens:
            raise invalid_value("thinking.budget_tokens", "`max_tokens` must be greater than "
                                                          "`thinking.budget_tokens`")
    return {"enable_thinking": kind == "enabled"}


_SESSION_SUFFIX = re.compile(r"_session_([A-Za-z0-9-]{1,128})$")


def _session_from_metadata(value: Any) -> str | None:
    """The KV session a request continues: `session_id` in metadata.user_id, which Claude Code
    sends as a JSON string (older clients: `user_…_account_…_session_<uuid>`). Bookkeeping
    otherwise: a user_id without one keys nothing."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid_value("metadata", "'metadata' must be an object")
    user_id = value.get("user_id")
    if user_id is None:
        return None
    if not isinstance(user_id, str):
        raise invalid_value("metadata.user_id", "'metadata.user_id' must be a string")
    parsed, data = validation.try_loads(user_id)  # a JSON string, or not: either is a user id
    if not parsed:
        match = _SESSION_SUFFIX.search(user_id[-256:])
        return match.group(1) if match else None
    session = data.get("session_id") if isinstance(data, dict) else None
    if isinstance(session, str) and 1 <= len(session) <= MAX_SESSION_ID_CHARS:
        return session
    return None
