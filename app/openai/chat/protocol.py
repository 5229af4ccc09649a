"""The chat completion request: parsed and validated into the shared ChatRequest, nothing else."""

from __future__ import annotations

from typing import Any

from app import validation
from app.http.chat import MAX_MESSAGES, ChatRequest, ResponseFormat
from app.http.errors import invalid_value
from app.http.fields import Fields, message_list
from app.http.llama_sampling import parse_llama_sampling
from app.http.sessions import parse_session_id
from app.http.thinking import effort_kwargs, switch_kwargs
from app.text.unread import placeholder

from ..stream_options import parse_stream

ROLES = ("system", "developer", "user", "assistant", "tool")
# Optional message fields a template writes as text: a string when present.
STRING_FIELDS = ("name", "tool_call_id", "reasoning_content")
MAX_CHOICES = 8

# Fields OpenAI treats as bookkeeping: accepted, and they change nothing.
METADATA_FIELDS = ("user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
                   "prompt_cache_retention", "prompt_cache_options")


def parse_chat_request(body: Any) -> ChatRequest:
    f = Fields.of(body)
    model = f.string("model", None)
    messages = _messages(f.raw("messages"))
    if isinstance(body, dict) and body.get("max_tokens") == -1:  # llama.cpp's "no limit" (its web UI's default)
        body.pop("max_tokens")
    sampling = parse_llama_sampling(f)  # llama.cpp's fields too: its web UI sends them here
    params = sampling.params
    reasoning_split = _reasoning_format(f.raw("reasoning_format"))
    stream, include_usage = parse_stream(f)
    n = f.integer("n", 1, lo=1, hi=MAX_CHOICES)
    tools = _tools(f.array("tools"))
    tool_choice, forced_tool = _tool_choice(f.raw("tool_choice"), tools)
    if tool_choice == "none":
        tools = None  # OpenAI: the model sees no tools
    parallel_tool_calls = f.boolean("parallel_tool_calls", True)
    response_format = _response_format(f.raw("response_format"))
    logprobs = f.boolean("logprobs", False)
    top_logprobs = f.integer("top_logprobs", 0, lo=0, hi=20)
    if top_logprobs and not logprobs:
        raise invalid_value("top_logprobs", "'top_logprobs' requires 'logprobs': true")
    # a client's ways of asking for thinking, weakest first: chat_template_kwargs has the last word
    template_kwargs = (effort_kwargs(f.raw("reasoning_effort"), "reasoning_effort")
                       | switch_kwargs(f.raw("enable_thinking"), f.raw("thinking"))
                       | _template_kwargs(f.obj("chat_template_kwargs") or {}))
    return_progress = f.boolean("return_progress", False) and stream  # llama.cpp: only streams report it
    session_id = parse_session_id(f.raw("session_id"))
    for name in METADATA_FIELDS:
        f.raw(name)
    # gpt-5's answer length hint (the Agents SDK's and the AI SDK's settings send it): no model
    # here was trained on it, so like Responses' text.verbosity it is taken and changes nothing
    if f.raw("verbosity") not in (None, "low", "medium", "high"):
        raise invalid_value("verbosity", "'verbosity' must be 'low', 'medium' or 'high'")
    _refuse_unknown(f)
    return ChatRequest(
        model=model,
        messages=messages,
        params=params,
        stream=stream,
        include_usage=include_usage,
        tools=tools,
        parallel_tool_calls=parallel_tool_calls,
        tool_choice=tool_choice,
        forced_tool=forced_tool,
        response_format=response_format,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        n=n,
        template_kwargs=template_kwargs,
        session_id=session_id,
        return_progress=return_progress,
        cache_prompt=sampling.cache_prompt,
        reasoning_split=reasoning_split,
    )


# llama.cpp's reasoning_format: a model's thinking goes to reasoning_content ("auto", "deepseek":
# what this server does by default) or stays in the content as written ("none").
REASONING_FORMATS = {"auto": True, "deepseek": True, "none": False}


def _reasoning_format(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, str) or value not in REASONING_FORMATS:
        raise invalid_value("reasoning_format", "'reasoning_format' must be one of "
                            + ", ".join(f"'{v}'" for v in REASONING_FORMATS))
    return REASONING_FORMATS[value]


def _messages(value: Any) -> list[dict[str, Any]]:
    return [_message(i, m) for i, m in enumerate(message_list(value, MAX_MESSAGES))]


def _message(i: int, m: Any) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise invalid_value(where, f"'{where}' must be an object")
    role = m.get("role")
    if role not in ROLES:
        raise invalid_value(f"{where}.role", f"'{where}.role' must be one of {', '.join(ROLES)}")
    for key in STRING_FIELDS:  # the template writes them as text
        validation.require_str(m.get(key), f"{where}.{key}")
    out = dict(m)
    out["content"] = _content(where, role, m.get("content"), has_tool_calls=bool(m.get("tool_calls")))
    if m.get("tool_calls") is not None:
        if role != "assistant":
            raise invalid_value(f"{where}.tool_calls", "only assistant messages carry tool_calls")
        out["tool_calls"] = _tool_calls(where, m["tool_calls"])
    if role == "developer":  # templates know only "system"
        out["role"] = "system"
    return out


# What the server itself gives the template: a client's chat_template_kwargs cannot replace them.
RESERVED_TEMPLATE_NAMES = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                           "raise_exception", "strftime_now")


def _template_kwargs(value: dict[str, Any]) -> dict[str, Any]:
    for name in value:
        if name in RESERVED_TEMPLATE_NAMES:
            raise invalid_value(f"chat_template_kwargs.{name}",
                                f"'chat_template_kwargs' cannot set {name!r}: the server sets it")
    return value


def _tool_calls(where: str, calls: Any) -> list[dict[str, Any]]:
    """Assistant tool calls as templates expect them (HF convention: arguments as an object)."""
    if not isinstance(calls, list):
        raise invalid_value(f"{where}.tool_calls", f"'{where}.tool_calls' must be an array")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid_value(f"{where}.tool_calls[{j}]", "each tool call needs a function with a string 'name'")
        at = f"{where}.tool_calls[{j}].function.arguments"
        arguments = fn.get("arguments", {})
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str):
            arguments = validation.loads_embedded(arguments, param=at, what=f"'{at}'") if arguments.strip() else {}
        if not isinstance(arguments, dict):  # templates iterate it as an object (arguments|items)
            raise invalid_value(at, "tool call arguments must be a JSON object (or one as a string)")
        validation.require_str(call.get("id"), f"{where}.tool_calls[{j}].id")
        out.append({**call, "function": {**fn, "arguments": arguments}})
    return out


# Content parts the model cannot read (it has no vision or audio): a placeholder (app/text/unread.py).
UNREAD_PARTS = {"image_url": "image", "input_audio": "audio", "file": "file"}


def _placeholder(kind: str, part: dict[str, Any]) -> str:
    inner = part.get("file") if isinstance(part.get("file"), dict) else {}
    name = inner.get("filename") or inner.get("file_id") if kind == "file" else None
    return placeholder("chat", kind, UNREAD_PARTS[kind], name if isinstance(name, str) and name else None)


def _content(where: str, role: str, content: Any, *, has_tool_calls: bool) -> str | None:
    if content is None:
        if role == "assistant" and has_tool_calls:
            return None
        if role == "assistant":
            return ""
        raise invalid_value(f"{where}.content", f"'{where}.content' is required")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if not isinstance(kind, str):
                kind = type(kind).__name__
            if kind in UNREAD_PARTS:
                parts.append(_placeholder(kind, part))
                continue
            if kind == "refusal" and role == "assistant" and isinstance(part.get("refusal"), str):
                parts.append(part["refusal"])
                continue
            if kind not in ("text", "input_text"):
                raise invalid_value(f"{where}.content[{j}]",
                                    f"content part of type {kind!r} is not supported; this model reads text only")
            text = part.get("text")
            if not isinstance(text, str):
                raise invalid_value(f"{where}.content[{j}].text", "a text content part needs a string 'text'")
            parts.append(text)
        # parts on lines of their own (vLLM's join): "Say hi" and "please" must not read "Say hiplease"
        return "\n".join(parts)
    raise invalid_value(f"{where}.content", f"'{where}.content' must be a string or an array of text parts")


def _tools(value: list[Any] | None) -> list[dict[str, Any]] | None:
    if not value:
        return None
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise invalid_value(f"tools[{i}]", "each tool must be {\"type\": \"function\", \"function\": {...}}")
        if not isinstance(tool["function"].get("name"), str):
            raise invalid_value(f"tools[{i}].function.name", "each function needs a string 'name'")
        # the template writes them (tojson), the grammar compiles the schema: an object, a string
        validation.require_obj(tool["function"].get("parameters"), f"tools[{i}].function.parameters")
        validation.require_str(tool["function"].get("description"), f"tools[{i}].function.description")
    return value


def _tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> tuple[str, str | None]:
    """("auto" | "none" | "required" | "function", the forced function's name or None)."""
    if value is None:
        return "auto", None
    if value in ("auto", "none"):
        return value, None
    if value == "required":
        if not tools:
            raise invalid_value("tool_choice", "tool_choice 'required' needs at least one tool in 'tools'")
        return "required", None
    if isinstance(value, dict):
        fn = value.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if value.get("type") != "function" or not isinstance(name, str):
            raise invalid_value("tool_choice", "a tool_choice object must be "
                                "{\"type\": \"function\", \"function\": {\"name\": ...}}")
        if name not in {t["function"]["name"] for t in tools or ()}:
            raise invalid_value("tool_choice", f"tool_choice names the function {name!r}, which is not in 'tools'")
        return "function", name
    raise invalid_value("tool_choice", "tool_choice must be 'auto', 'none', 'required' or a function object")


def _response_format(value: Any) -> ResponseFormat | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat(schema=None)
    if kind != "json_schema":
        raise invalid_value("response_format", "response_format.type must be 'text', 'json_object' or 'json_schema'")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise invalid_value("response_format.json_schema", "json_schema response formats need a 'json_schema' object")
    name, schema, strict = spec.get("name"), spec.get("schema"), spec.get("strict")
    if name is not None and not isinstance(name, str):
        raise invalid_value("response_format.json_schema.name", "'name' must be a string")
    if schema is not None and not isinstance(schema, (dict, bool)):
        raise invalid_value("response_format.json_schema.schema", "'schema' must be a JSON schema object")
    if strict is not None and not isinstance(strict, bool):
        raise invalid_value("response_format.json_schema.strict", "'strict' must be a boolean")
    # Strict or not, the schema is enforced: constrained decoding costs nothing extra here.
    return ResponseFormat(schema=schema if isinstance(schema, dict) else None, name=name)


# Known OpenAI parameters this server does not implement yet: refused by name
# rather than silently ignored.
NOT_SUPPORTED = ("audio", "modalities", "prediction", "web_search_options", "functions", "function_call")


def _refuse_unknown(f: Fields) -> None:
    for name in NOT_SUPPORTED:
        if f.body.get(name) not in (None, False):
            raise invalid_value(name, f"'{name}' is not supported by this server")
        f.raw(name)
    f.reject_unknown()
