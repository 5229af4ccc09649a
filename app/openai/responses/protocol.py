"""The Responses API request (POST /v1/responses): parsed and validated, nothing else.

`input` items become chat messages in the convention the chat templates read (the
one app/openai/chat/protocol.py produces): system/user/assistant/tool roles, string
content, assistant `tool_calls` with arguments as an object, tool messages with
`tool_call_id`. serving.py turns the whole into a ChatCompletionRequest.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from app import validation
from app.engine import SamplingParams

from ..chat.protocol import ResponseFormat
from ..errors import APIError, invalid_value
from ..fields import Fields
from ..generation_params import GenerationParams
from ..sessions import parse_session_id

log = logging.getLogger("etserve")

MAX_ITEMS = 4096
MESSAGE_ROLES = ("system", "developer", "user", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")

# Accepted and without effect (bookkeeping, or options of OpenAI's own service).
BOOKKEEPING = ("metadata", "client_metadata", "user", "service_tier", "truncation", "include",
               "safety_identifier", "prompt_cache_retention")
# Known Responses parameters this server does not implement: refused by name unless
# absent or at their "off" value.
NOT_SUPPORTED = ("background", "conversation", "prompt", "max_tool_calls", "top_logprobs",
                 "context_management", "stream_options", "moderation", "image", "access_programs",
                 "background_options", "prompt_cache_options")
# Tool types etserve cannot run: accepted (clients such as Codex always send some) and left
# out of the prompt. Anything that is not a function tool is treated so.
_logged_tool_types: set[str] = set()


@dataclass(frozen=True)
class ResponsesRequest:
    model: str | None
    messages: list[dict[str, Any]]  # this request's input as chat messages (no instructions)
    instructions: str | None
    params: GenerationParams
    stream: bool
    tools: list[dict[str, Any]] | None  # chat-form function tools
    tool_choice: str  # "auto", "none", "required" or "function" (then forced_tool names it)
    forced_tool: str | None
    parallel_tool_calls: bool
    response_format: ResponseFormat | None
    text: dict[str, Any]  # echoed in the response
    reasoning: dict[str, Any] | None
    store: bool
    previous_response_id: str | None
    metadata: dict[str, Any]
    prompt_cache_key: str | None
    user: str | None
    service_tier: str | None
    truncation: str
    echo_tools: list[dict[str, Any]]  # the function tools as the request sent them
    echo_tool_choice: Any
    session_id: str | None = None  # prompt_cache_key, else a session header
    owner: str | None = None  # the client (app/auth.py) whose stored responses this request may read


def parse_responses_request(body: Any) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_request")
    f = Fields(body)
    model = f.string("model", None)
    instructions = f.string("instructions", None)
    previous_response_id = f.string("previous_response_id", None)
    messages = input_messages(f.raw("input"))
    max_output_tokens = f.integer("max_output_tokens", None, lo=1)
    sampling = SamplingParams(temperature=f.number("temperature", 1.0, lo=0.0, hi=2.0),
                              top_p=f.number("top_p", 1.0, lo=0.0, hi=1.0, lo_open=True))
    params = GenerationParams(sampling=sampling, max_tokens=max_output_tokens, stop=())
    stream = f.boolean("stream", False)
    raw_tools = f.array("tools") or []
    tools, echo_tools = _tools(raw_tools)
    raw_choice = f.raw("tool_choice")
    tool_choice, forced_tool = _tool_choice(raw_choice, tools)
    if tool_choice == "none":
        tools = None  # the model sees no tools
    parallel_tool_calls = f.boolean("parallel_tool_calls", True)
    text = f.obj("text") or {}
    response_format = _text_format(text)
    reasoning = f.obj("reasoning")
    for key in ("effort", "summary", "generate_summary"):  # echoed in the response; strings when set
        validation.require_str((reasoning or {}).get(key), f"reasoning.{key}")
    store = f.boolean("store", True)
    metadata = f.obj("metadata") or {}
    prompt_cache_key = parse_session_id(f.raw("prompt_cache_key"), "prompt_cache_key")
    user = f.string("user", None)
    service_tier = f.string("service_tier", None)
    truncation = f.string("truncation", "disabled")
    if truncation not in ("auto", "disabled"):
        raise invalid_value("truncation", "'truncation' must be 'auto' or 'disabled'")
    include = f.array("include") or []
    if not all(isinstance(x, str) for x in include):
        raise invalid_value("include", "'include' must be an array of strings")
    for name in BOOKKEEPING:
        f.raw(name)
    _refuse_unknown(f)
    return ResponsesRequest(
        model=model, messages=messages, instructions=instructions, params=params, stream=stream,
        tools=tools or None, tool_choice=tool_choice, forced_tool=forced_tool,
        parallel_tool_calls=parallel_tool_calls, response_format=response_format,
        text={"format": {"type": "text"}, **text}, reasoning=reasoning, store=store,
        previous_response_id=previous_response_id, metadata=metadata, prompt_cache_key=prompt_cache_key,
        user=user, service_tier=service_tier, truncation=truncation, echo_tools=echo_tools,
        echo_tool_choice=raw_choice if raw_choice is not None else "auto", session_id=prompt_cache_key,
    )


# ---- input ---------------------------------------------------------------------------------

def input_messages(value: Any) -> list[dict[str, Any]]:
    """`input` (a string, or an array of items) as chat messages."""
    if value is None:
        raise APIError(400, "'input' is required", code="missing_required_parameter", param="input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise invalid_value("input", "'input' must be a string or an array of input items")
    if len(value) > MAX_ITEMS:
        raise invalid_value("input", f"'input' holds at most {MAX_ITEMS} items")
    return items_to_messages(value, "input")


def items_to_messages(items: list[Any], where: str) -> list[dict[str, Any]]:
    """Items in order as chat messages: consecutive function calls (after an assistant message,
    if one precedes them) form one assistant turn; a reasoning item's text becomes the next
    assistant turn's `reasoning_content` (templates that keep reasoning read it from there)."""
    out: list[dict[str, Any]] = []
    reasoning: list[str] = []
    call_names: dict[str, str] = {}
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise invalid_value(at, f"'{at}' must be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            message = _message(at, item)
            if message["role"] == "assistant" and reasoning:
                message["reasoning_content"] = "\n".join(reasoning)
                reasoning = []
            out.append(message)
        elif kind == "function_call":
            call = _function_call(at, item)
            call_names[call["id"]] = call["function"]["name"]
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and not reasoning:
                last.setdefault("tool_calls", []).append(call)
            else:
                turn: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning:
                    turn["reasoning_content"] = "\n".join(reasoning)
                    reasoning = []
                out.append(turn)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise invalid_value(f"{at}.call_id", "a function_call_output needs a string 'call_id'")
            message = {"role": "tool", "tool_call_id": call_id, "content": _output_text(at, item.get("output"))}
            if call_id in call_names:
                message["name"] = call_names[call_id]
            out.append(message)
        elif kind == "reasoning":
            text = _reasoning_text(at, item)
            if text:
                reasoning.append(text)
        elif kind is None:
            raise invalid_value(f"{at}.type", f"'{at}' needs a 'type' (or a 'role' for a message)")
        else:
            raise invalid_value(f"{at}.type", f"input items of type {kind!r} are not supported by this server")
    return out


def _message(at: str, item: dict[str, Any]) -> dict[str, Any]:
    role = item.get("role")
    if role not in MESSAGE_ROLES:
        raise invalid_value(f"{at}.role", f"'{at}.role' must be one of {', '.join(MESSAGE_ROLES)}")
    content = _content(at, item.get("content"))
    return {"role": "system" if role == "developer" else role, "content": content}


def _content(at: str, content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid_value(f"{at}.content", f"'{at}.content' must be a string or an array of content parts")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append(part["refusal"])
            continue
        if kind not in TEXT_PARTS:
            shown = kind if kind is not None else type(part).__name__
            raise invalid_value(f"{at}.content[{j}]",
                                f"content part of type {shown!r} is not supported; this model reads text only")
        text = part.get("text")
        if not isinstance(text, str):
            raise invalid_value(f"{at}.content[{j}].text", "a text content part needs a string 'text'")
        parts.append(text)
    return "".join(parts)


def _output_text(at: str, output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return _content(at + ".output", output)
    raise invalid_value(f"{at}.output", "a function_call_output's 'output' must be a string or text parts")


def _function_call(at: str, item: dict[str, Any]) -> dict[str, Any]:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
    if not isinstance(call_id, str) or not call_id:
        raise invalid_value(f"{at}.call_id", "a function_call needs a string 'call_id'")
    if not isinstance(name, str) or not name:
        raise invalid_value(f"{at}.name", "a function_call needs a string 'name'")
    if not isinstance(arguments, str):
        raise invalid_value(f"{at}.arguments", "a function_call's 'arguments' must be a JSON object as a string")
    parsed = validation.loads_embedded(arguments, param=f"{at}.arguments", what=f"'{at}.arguments'") \
        if arguments.strip() else {}
    if not isinstance(parsed, dict):
        raise invalid_value(f"{at}.arguments", "a function_call's 'arguments' must be a JSON object")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": parsed}}


def _reasoning_text(at: str, item: dict[str, Any]) -> str:
    """The readable text of a reasoning item (its summary, else its content); encrypted
    content means nothing to this server and is skipped."""
    texts = {}
    for key in ("summary", "content"):
        value = item.get(key)
        if value is not None and not isinstance(value, list):
            raise invalid_value(f"{at}.{key}", f"a reasoning item's '{key}' must be an array")
        texts[key] = "\n".join(_content(f"{at}.{key}", [part]) for part in value or ())
    return texts["summary"] or texts["content"]


# ---- tools -----------------------------------------------------------------------------------

def _tools(value: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(function tools in the chat form, the same as the request sent them)."""
    tools, echo = [], []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise invalid_value(f"tools[{i}]", f"'tools[{i}]' must be an object with a 'type'")
        if tool["type"] != "function":
            _log_ignored_tool(tool["type"])
            continue
        name, parameters = tool.get("name"), tool.get("parameters")
        if not isinstance(name, str) or not name:
            raise invalid_value(f"tools[{i}].name", "each function tool needs a string 'name'")
        if parameters is not None and not isinstance(parameters, dict):
            raise invalid_value(f"tools[{i}].parameters", "a function tool's 'parameters' must be a JSON schema object")
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise invalid_value(f"tools[{i}].description", "a function tool's 'description' must be a string")
        function: dict[str, Any] = {"name": name, "parameters": parameters or {"type": "object", "properties": {}}}
        if description:
            function["description"] = description
        tools.append({"type": "function", "function": function})
        echo.append({"type": "function", "name": name, "description": description,
                     "parameters": parameters, "strict": bool(tool.get("strict", False))})
    return tools, echo


def _log_ignored_tool(kind: str) -> None:
    if kind not in _logged_tool_types and len(_logged_tool_types) < 64:
        _logged_tool_types.add(kind[:64])
        log.info("responses: tools of type %r are accepted and left out of the prompt (etserve cannot run them)",
                 kind[:64])


def _tool_choice(value: Any, tools: list[dict[str, Any]]) -> tuple[str, str | None]:
    if value is None or value == "auto":
        return "auto", None
    if value == "none":
        return "none", None
    if value == "required":
        if not tools:
            raise invalid_value("tool_choice", "tool_choice 'required' needs at least one function tool in 'tools'")
        return "required", None
    if isinstance(value, dict) and value.get("type") == "function":
        name = value.get("name")
        if not isinstance(name, str):
            raise invalid_value("tool_choice", "a function tool_choice is {\"type\": \"function\", \"name\": ...}")
        if name not in {t["function"]["name"] for t in tools}:
            raise invalid_value("tool_choice", f"tool_choice names the function {name!r}, which is not in 'tools'")
        return "function", name
    if isinstance(value, dict) and isinstance(value.get("type"), str):
        raise invalid_value("tool_choice", f"tool_choice of type {value['type']!r} is not supported: this server "
                            "runs no hosted tools; use 'auto', 'none', 'required' or a function")
    raise invalid_value("tool_choice", "tool_choice must be 'auto', 'none', 'required' or "
                        "{\"type\": \"function\", \"name\": ...}")


# ---- text.format -----------------------------------------------------------------------------

def _text_format(text: dict[str, Any]) -> ResponseFormat | None:
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat(schema=None)
    if kind != "json_schema":
        raise invalid_value("text.format", "text.format.type must be 'text', 'json_object' or 'json_schema'")
    name, schema, strict = fmt.get("name"), fmt.get("schema"), fmt.get("strict")
    if name is not None and not isinstance(name, str):
        raise invalid_value("text.format.name", "'name' must be a string")
    if not isinstance(schema, dict):
        raise invalid_value("text.format.schema", "a json_schema text format needs a 'schema' object")
    if strict is not None and not isinstance(strict, bool):
        raise invalid_value("text.format.strict", "'strict' must be a boolean")
    return ResponseFormat(schema=schema, name=name)


def _refuse_unknown(f: Fields) -> None:
    for name in NOT_SUPPORTED:
        if f.body.get(name) not in (None, False, 0, {}, []):
            raise invalid_value(name, f"'{name}' is not supported by this server")
        f.raw(name)
    f.reject_unknown()
