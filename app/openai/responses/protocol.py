"""The Responses API request (POST /v1/responses): parsed and validated, nothing else.

`input` items become chat messages in the convention the chat templates read (the
one app/openai/chat/protocol.py produces): system/user/assistant/tool roles, string
content, assistant `tool_calls` with arguments as an object, tool messages with
`tool_call_id`. serving.py turns the whole into a ChatRequest.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from app import validation
from app.engine import SamplingParams
from app.http.chat import ResponseFormat
from app.http.errors import APIError, invalid_value
from app.http.fields import Fields
from app.http.generation_params import GenerationParams
from app.http.sessions import parse_session_id
from app.http.thinking import effort_kwargs
from app.text.unread import placeholder

log = logging.getLogger("etserve")

MAX_ITEMS = 4096
MESSAGE_ROLES = ("system", "developer", "user", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")

# Accepted and without effect (bookkeeping, or options of OpenAI's own service).
BOOKKEEPING = ("metadata", "client_metadata", "user", "service_tier", "truncation", "include",
               "safety_identifier", "prompt_cache_retention")
# max_tool_calls bounds calls to built-in tools (OpenAI's reference), which this server does not
# run: met by construction. stream_options holds only include_obfuscation: padding on delta events
# against side channels on OpenAI's network, which changes no content; none is sent either way.
# Known Responses parameters this server does not implement: refused by name unless
# absent or at their "off" value.
NOT_SUPPORTED = ("background", "conversation", "prompt",
                 "context_management", "moderation", "image", "access_programs",
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
    tool_refs: dict[str, "ToolRef"] = field(default_factory=dict)  # prompt name -> the client's tool
    logprobs: bool = False  # include "message.output_text.logprobs" (or top_logprobs asked for)
    top_logprobs: int = 0  # alternatives with each token's logprob (0-20)
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # reasoning.effort's (app/http/thinking.py)
    owner: str | None = None  # the client (app/auth.py) whose stored responses this request may read
    # `input` as sent, when it holds item references: the serving side resolves them from the
    # store, then reads the items (messages is empty until then)
    referring_input: list[Any] | None = None


@dataclass(frozen=True)
class ToolRef:
    """A tool as the client knows it, behind the function the model is offered: a plain function,
    a function inside a `namespace` tool (Codex's MCP servers and sub-agents), or a freeform
    (`custom`) tool, offered as a function of one string argument, `input`."""
    kind: str  # "function" or "custom"
    name: str
    namespace: str | None = None


def parse_responses_request(body: Any) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_request")
    f = Fields(body)
    model = f.string("model", None)
    instructions = f.string("instructions", None)
    previous_response_id = f.string("previous_response_id", None)
    raw_tools = f.array("tools") or []
    tools, echo_tools, tool_refs = _tools(raw_tools)
    raw_input = f.raw("input")
    referring = _referring(raw_input)
    messages = [] if referring else input_messages(raw_input, prompt_names(tool_refs))
    max_output_tokens = f.integer("max_output_tokens", None, lo=1)
    sampling = SamplingParams(temperature=f.number("temperature", 1.0, lo=0.0, hi=2.0),
                              top_p=f.number("top_p", 1.0, lo=0.0, hi=1.0))
    params = GenerationParams(sampling=sampling, max_tokens=max_output_tokens, stop=())
    stream = f.boolean("stream", False)
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
    template_kwargs = effort_kwargs((reasoning or {}).get("effort"), "reasoning.effort")
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
    top_logprobs = f.integer("top_logprobs", 0, lo=0, hi=20)
    logprobs = "message.output_text.logprobs" in include or top_logprobs > 0
    for name in BOOKKEEPING:
        f.raw(name)
    f.integer("max_tool_calls", None, lo=1)
    stream_options = f.obj("stream_options") or {}
    if set(stream_options) - {"include_obfuscation"}:
        raise invalid_value("stream_options", "'stream_options' holds only 'include_obfuscation' here")
    if not isinstance(stream_options.get("include_obfuscation", False), bool):
        raise invalid_value("stream_options.include_obfuscation", "'include_obfuscation' must be a boolean")
    _refuse_unknown(f)
    return ResponsesRequest(
        model=model, messages=messages, instructions=instructions, params=params, stream=stream,
        tools=tools or None, tool_choice=tool_choice, forced_tool=forced_tool,
        parallel_tool_calls=parallel_tool_calls, response_format=response_format,
        text={"format": {"type": "text"}, **text}, reasoning=reasoning, store=store,
        previous_response_id=previous_response_id, metadata=metadata, prompt_cache_key=prompt_cache_key,
        user=user, service_tier=service_tier, truncation=truncation, echo_tools=echo_tools,
        echo_tool_choice=raw_choice if raw_choice is not None else "auto", session_id=prompt_cache_key,
        tool_refs=tool_refs, logprobs=logprobs, top_logprobs=top_logprobs, template_kwargs=template_kwargs,
        referring_input=raw_input if referring else None,
    )


def _referring(value: Any) -> bool:
    """Whether `input` holds item references (`{"type": "item_reference", "id": ...}`), each
    checked for its id here; the store resolves them (serving.py)."""
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        return False  # (input_messages says what is wrong)
    found = False
    for i, item in enumerate(value):
        if isinstance(item, dict) and item.get("type") == "item_reference":
            if not isinstance(item.get("id"), str) or not item["id"]:
                raise invalid_value(f"input[{i}].id", "an item_reference needs a string 'id'")
            found = True
    return found


# ---- input ---------------------------------------------------------------------------------

# Every input item type of the Responses API reference, by what becomes of it here. Calls and
# their outputs become the model's tool turns; what hosted tools (which this server does not
# run) did in a conversation begun elsewhere becomes a short note; compaction items become
# text. Item references are resolved from the store first (the items of the responses kept
# here: what the AI SDK sends for an earlier turn's output when `store` is on).
CALL_ITEMS = ("function_call", "custom_tool_call", "local_shell_call", "shell_call", "apply_patch_call",
              "computer_call", "mcp_call")
OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output", "shell_call_output",
                "apply_patch_call_output", "computer_call_output")
NOTE_ITEMS = ("web_search_call", "file_search_call", "image_generation_call", "code_interpreter_call",
              "mcp_list_tools", "mcp_approval_request", "mcp_approval_response", "tool_search_call",
              "tool_search_output")
TEXT_ITEMS = ("compaction", "compaction_summary")
REFUSED_ITEMS = {"item_reference": "an item reference is resolved before the items are read"}
# Content parts the model cannot read (it has no vision or audio): a short placeholder, and a warning.
PLACEHOLDER_PARTS = ("input_image", "input_file", "input_audio", "image_url", "image", "file", "audio")


def prompt_names(refs: dict[str, ToolRef]) -> dict[tuple[str, str | None], str]:
    """(client name, namespace) -> the function name the model knows the tool by."""
    return {(ref.name, ref.namespace): name for name, ref in refs.items()}


def input_messages(value: Any, names: dict[tuple[str, str | None], str] | None = None) -> list[dict[str, Any]]:
    """`input` (a string, or an array of items) as chat messages."""
    if value is None:
        raise APIError(400, "'input' is required", code="missing_required_parameter", param="input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise invalid_value("input", "'input' must be a string or an array of input items")
    if len(value) > MAX_ITEMS:
        raise invalid_value("input", f"'input' holds at most {MAX_ITEMS} items")
    return items_to_messages(value, "input", names)


def items_to_messages(items: list[Any], where: str,
                      names: dict[tuple[str, str | None], str] | None = None) -> list[dict[str, Any]]:
    """Items in order as chat messages: consecutive calls (after an assistant message, if one
    precedes them) form one assistant turn; a reasoning item's text becomes the next
    assistant turn's `reasoning_content` (templates that keep reasoning read it from there).
    `names` maps a call's (name, namespace) to the function name the model was offered."""
    names = names or {}
    out: list[dict[str, Any]] = []
    reasoning: list[str] = []
    call_names: dict[str, str] = {}

    def assistant_turn() -> dict[str, Any]:
        nonlocal reasoning
        last = out[-1] if out else None
        if last is not None and last["role"] == "assistant" and not reasoning:
            return last
        turn: dict[str, Any] = {"role": "assistant", "content": None}
        if reasoning:
            turn["reasoning_content"] = "\n".join(reasoning)
            reasoning = []
        out.append(turn)
        return turn

    def tool_result(call_id: str, content: str) -> None:
        message = {"role": "tool", "tool_call_id": call_id, "content": content}
        if call_id in call_names:
            message["name"] = call_names[call_id]
        out.append(message)

    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise invalid_value(at, f"'{at}' must be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind is not None and not isinstance(kind, str):
            raise invalid_value(f"{at}.type", f"'{at}.type' must be a string")
        if kind == "message":
            message = _message(at, item)
            if message["role"] == "assistant" and reasoning:
                message["reasoning_content"] = "\n".join(reasoning)
                reasoning = []
            out.append(message)
        elif kind in CALL_ITEMS:
            call = _call(at, kind, item, names)
            call_names[call["id"]] = call["function"]["name"]
            assistant_turn().setdefault("tool_calls", []).append(call)
            if kind == "mcp_call" and (item.get("output") is not None or item.get("error") is not None):
                tool_result(call["id"], _text_of(at + ".output", item.get("output") if item.get("output") is not None
                                                 else f"error: {item.get('error')}", objects=True))
        elif kind in OUTPUT_ITEMS:
            call_id = item.get("call_id", item.get("id") if kind == "local_shell_call_output" else None)
            if not isinstance(call_id, str) or not call_id:
                raise invalid_value(f"{at}.call_id", f"a {kind} needs a string 'call_id'")
            tool_result(call_id, _text_of(at + ".output", item.get("output"), objects=kind == "computer_call_output"))
        elif kind == "reasoning":
            text = _reasoning_text(at, item)
            if text:
                reasoning.append(text)
        elif kind in NOTE_ITEMS:
            note = _note(kind, item)
            turn = assistant_turn() if kind not in ("mcp_approval_response",) else None
            if turn is None:
                out.append({"role": "user", "content": note})
            else:
                turn["content"] = note if not turn.get("content") else turn["content"] + "\n" + note
        elif kind in TEXT_ITEMS:
            out.append({"role": "user", "content": _compaction_text(at, item)})
        elif kind in REFUSED_ITEMS:
            raise invalid_value(f"{at}.type", f"input items of type {kind!r}: {REFUSED_ITEMS[kind]}")
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
        if kind in PLACEHOLDER_PARTS:
            parts.append(_placeholder(kind, part))
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


def _placeholder(kind: str, part: dict[str, Any]) -> str:
    """What the model reads instead of an image, file or audio part (it reads text only)."""
    if kind in ("input_file", "file"):
        inner = part.get("file") if isinstance(part.get("file"), dict) else part
        name = inner.get("filename") or inner.get("file_id") or inner.get("file_url")
        return placeholder("responses", kind, "file", str(name) if name else None)
    return placeholder("responses", kind, "audio" if kind in ("input_audio", "audio") else "image")


def _text_of(at: str, output: Any, *, objects: bool = False) -> str:
    """A tool output as text: a string or text parts (or, with `objects`, an object such as a
    computer call's screenshot, as JSON)."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return _content(at, output)
    if objects and isinstance(output, dict):
        return json.dumps(output)[:2000]
    raise invalid_value(at, f"'{at}' must be a string or an array of content parts")


def _arguments(at: str, arguments: Any) -> dict[str, Any]:
    if not isinstance(arguments, str):
        raise invalid_value(f"{at}.arguments", "a function_call's 'arguments' must be a JSON object as a string")
    parsed = validation.loads_embedded(arguments, param=f"{at}.arguments", what=f"'{at}.arguments'") \
        if arguments.strip() else {}
    if not isinstance(parsed, dict):
        raise invalid_value(f"{at}.arguments", "a function_call's 'arguments' must be a JSON object")
    return parsed


def _call(at: str, kind: str, item: dict[str, Any], names: dict[tuple[str, str | None], str]) -> dict[str, Any]:
    """A call item as an assistant tool call, under the name the model knows the tool by."""
    call_id = item.get("call_id") or (item.get("id") if kind in ("local_shell_call", "mcp_call") else None)
    if not isinstance(call_id, str) or not call_id:
        raise invalid_value(f"{at}.call_id", f"a {kind} needs a string 'call_id'")
    if kind == "function_call":
        name, namespace = item.get("name"), item.get("namespace")
        if not isinstance(name, str) or not name:
            raise invalid_value(f"{at}.name", "a function_call needs a string 'name'")
        if namespace is not None and not isinstance(namespace, str):
            raise invalid_value(f"{at}.namespace", "a function_call's 'namespace' must be a string")
        arguments = _arguments(at, item.get("arguments", "{}"))
        name = names.get((name, namespace)) or (f"{namespace}__{name}" if namespace else name)
    elif kind == "custom_tool_call":
        name, text = item.get("name"), item.get("input", "")
        if not isinstance(name, str) or not name or not isinstance(text, str):
            raise invalid_value(at, "a custom_tool_call needs a string 'name' and a string 'input'")
        name, arguments = names.get((name, None), name), {"input": text}
    elif kind == "mcp_call":
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_value(f"{at}.name", "an mcp_call needs a string 'name'")
        arguments = _arguments(at, item.get("arguments", "{}"))
    else:  # local_shell_call, shell_call, apply_patch_call, computer_call: their action is the arguments
        action = item.get("action", item.get("operation", {}))
        if not isinstance(action, dict):
            raise invalid_value(f"{at}.action", f"a {kind}'s 'action' must be an object")
        name, arguments = {"local_shell_call": "local_shell", "shell_call": "shell",
                           "apply_patch_call": "apply_patch", "computer_call": "computer"}[kind], action
        name = names.get((name, None), name)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _note(kind: str, item: dict[str, Any]) -> str:
    """A short note of what a hosted tool did (a conversation begun on another server)."""
    detail = item.get("action") or item.get("queries") or item.get("server_label") or item.get("arguments") or ""
    text = json.dumps(detail)[:500] if detail and not isinstance(detail, str) else str(detail)[:500]
    return f"[{kind}{': ' + text if text else ''}]"


def _compaction_text(at: str, item: dict[str, Any]) -> str:
    """A compaction item as text: its readable summary; encrypted content (another server's) is opaque."""
    for key in ("summary", "content", "text"):
        value = item.get(key)
        if isinstance(value, str) and value:
            return f"Summary of the earlier conversation:\n{value}"
        if isinstance(value, list) and value:
            return "Summary of the earlier conversation:\n" + _content(f"{at}.{key}", value)
    return "[An earlier part of this conversation was compacted; its summary is not readable here.]"


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

MAX_NAMESPACE_TOOLS = 256
CUSTOM_FORMAT_CHARS = 4000  # of a custom tool's grammar shown to the model


def _tools(value: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, ToolRef]]:
    """(the functions the model is offered, in the chat form; the tools as the request sent
    them; the offered name -> the client's tool). A namespace's functions are offered by their
    own name, or `namespace__name` where two tools share a name; a custom tool as a function
    of one string argument, `input`. Hosted tools (web_search, ...) are left out of the prompt."""
    tools, echo, refs = [], [], {}
    flat: list[tuple[str, dict[str, Any], ToolRef]] = []  # (where, tool, ref)
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise invalid_value(f"tools[{i}]", f"'tools[{i}]' must be an object with a 'type'")
        if tool["type"] == "function":
            flat.append((f"tools[{i}]", tool, ToolRef("function", _tool_name(f"tools[{i}]", tool))))
            echo.append({"type": "function", "name": tool["name"], "description": tool.get("description"),
                         "parameters": tool.get("parameters"), "strict": bool(tool.get("strict", False))})
        elif tool["type"] == "custom":
            flat.append((f"tools[{i}]", tool, ToolRef("custom", _tool_name(f"tools[{i}]", tool))))
            echo.append(tool)
        elif tool["type"] == "namespace":
            namespace = _tool_name(f"tools[{i}]", tool)
            inner = tool.get("tools")
            if not isinstance(inner, list) or len(inner) > MAX_NAMESPACE_TOOLS:
                raise invalid_value(f"tools[{i}].tools", f"a namespace tool needs a 'tools' array (at most "
                                                         f"{MAX_NAMESPACE_TOOLS})")
            for j, sub in enumerate(inner):
                where = f"tools[{i}].tools[{j}]"
                if not isinstance(sub, dict) or sub.get("type", "function") not in ("function", "custom"):
                    raise invalid_value(where, "a namespace holds function (or custom) tools")
                kind = sub.get("type", "function")
                flat.append((where, sub, ToolRef(kind, _tool_name(where, sub), namespace)))
            echo.append(tool)
        else:
            _log_ignored_tool(tool["type"])
    counts: dict[str, int] = {}
    for _, _, ref in flat:
        counts[ref.name] = counts.get(ref.name, 0) + 1
    for where, tool, ref in flat:
        name = ref.name if counts[ref.name] == 1 or ref.namespace is None else f"{ref.namespace}__{ref.name}"
        if name in refs:
            raise invalid_value(where, f"two tools are named {name!r}")
        refs[name] = ref
        tools.append({"type": "function", "function": _function(where, tool, ref, name)})
    return tools, echo, refs


def _tool_name(where: str, tool: dict[str, Any]) -> str:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise invalid_value(f"{where}.name", f"each {tool.get('type', 'function')} tool needs a string 'name'")
    return name


def _function(where: str, tool: dict[str, Any], ref: ToolRef, name: str) -> dict[str, Any]:
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid_value(f"{where}.description", "a tool's 'description' must be a string")
    if ref.kind == "custom":
        fmt = tool.get("format") or {}
        if not isinstance(fmt, dict):
            raise invalid_value(f"{where}.format", "a custom tool's 'format' must be an object")
        about = "The tool's input, as free text (not JSON)."
        if fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
            about += (f" It must follow this {fmt.get('syntax', '')} grammar:\n"
                      + fmt["definition"][:CUSTOM_FORMAT_CHARS])
        parameters = {"type": "object", "properties": {"input": {"type": "string", "description": about}},
                      "required": ["input"]}
    else:
        parameters = tool.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise invalid_value(f"{where}.parameters", "a function tool's 'parameters' must be a JSON schema object")
        parameters = parameters or {"type": "object", "properties": {}}
    # name, description, parameters: the order chat's tools come in and templates print them in.
    # With the description after the parameters, Qwen 0.5B named calls by the parameters'
    # pydantic title (`get_weather_args`) in 2 of 2 Agents SDK runs; in this order, as on chat, not.
    function: dict[str, Any] = {"name": name}
    if description:
        function["description"] = description
    function["parameters"] = parameters
    return function


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
    if isinstance(value, dict) and value.get("type") == "custom" and isinstance(value.get("name"), str):
        value = {"type": "function", "name": value["name"]}  # a custom tool is offered as a function
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
