"""A corpus of hostile requests, each with the status it must get (tests/e2e/test_hostile_corpus.py
replays it against a real server: the stated 4xx, never a 5xx, the worker alive after each).

A case is (name, method, path, body, status): the body is raw bytes, sent as application/json
unless the case says otherwise (content_type). Bodies are built here rather than stored as
JSON lines because some are not JSON at all: non-UTF-8 bytes, NaN literals, 10,000-deep nesting.
Add a case for every bad input a user or a fuzzer finds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    body: bytes | None
    status: int
    content_type: str = "application/json"


def _j(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


USER = [{"role": "user", "content": "hi"}]
DEEP_ARRAY = "[" * 10_000 + "]" * 10_000  # past the parser's own recursion limit
DEEP_OBJECT = '{"a":' * 3000 + "1" + "}" * 3000
JUST_TOO_DEEP = "[" * 65 + "]" * 65  # parses; one level past the limit (64)


def _chat(**kw) -> bytes:
    return _j({"messages": USER, "max_tokens": 2, **kw})


def _chat_history(arguments) -> bytes:
    return _j({"max_tokens": 2, "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]})


def _responses_history(arguments) -> bytes:
    return _j({"max_output_tokens": 2, "input": [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": arguments},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]})


def _messages(**kw) -> bytes:
    return _j({"max_tokens": 2, "messages": USER, **kw})


def _cases():
    chat, comp, resp, msgs, count = "/v1/chat/completions", "/v1/completions", "/v1/responses", \
        "/v1/messages", "/v1/messages/count_tokens"
    # ---- numbers past the float range, NaN / Infinity literals, huge integers: every API ----
    for path, body in ((chat, b'{"messages":[{"role":"user","content":"hi"}],"temperature":1e400}'),
                       (comp, b'{"prompt":"hi","top_p":-1e400}'),
                       (resp, b'{"input":"hi","temperature":1e999}'),
                       (msgs, b'{"max_tokens":2,"messages":[{"role":"user","content":"hi"}],"top_p":1e400}'),
                       (count, b'{"messages":[{"role":"user","content":"hi"}],"temperature":1e400}'),
                       ("/infill", b'{"input_prefix":"a","input_suffix":"b","temperature":1e400}'),
                       ("/tokenize", b'{"content":"a","add_special":1e400}'),
                       ("/detokenize", b'{"tokens":[1e400]}'),
                       ("/apply-template", b'{"messages":[{"role":"user","content":"hi"}],"n":1e400}')):
        yield Case(f"float-overflow{path.replace('/', '-')}", "POST", path, body, 400)
    for path, body in ((chat, b'{"messages":[{"role":"user","content":"hi"}],"temperature":NaN}'),
                       (comp, b'{"prompt":"hi","top_p":Infinity}'),
                       (resp, b'{"input":"hi","temperature":-Infinity}'),
                       (msgs, b'{"max_tokens":2,"messages":[{"role":"user","content":"hi"}],"temperature":NaN}'),
                       ("/infill", b'{"input_prefix":"a","input_suffix":"b","top_p":NaN}')):
        yield Case(f"nan-literal{path.replace('/', '-')}", "POST", path, body, 400)
    yield Case("huge-int-max-tokens-chat", "POST", chat,
               b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":' + b"9" * 5000 + b"}", 400)
    yield Case("huge-n", "POST", chat, _chat(n=10**30), 400)
    yield Case("huge-seed", "POST", comp, _j({"prompt": "hi", "seed": 2**80}), 400)
    yield Case("float-max-tokens-messages", "POST", msgs, b'{"max_tokens":1.5,"messages":[{"role":"user","content":"x"}]}',
               400)
    yield Case("negative-max-tokens-messages", "POST", msgs, _j({"max_tokens": -5, "messages": USER}), 400)
    yield Case("huge-token-id-detokenize", "POST", "/detokenize", _j({"tokens": [10**20]}), 400)
    yield Case("huge-token-id-prompt", "POST", comp, _j({"prompt": [10**20], "max_tokens": 1}), 400)
    yield Case("huge-n-indent-infill", "POST", "/infill", _j({"input_prefix": "a", "input_suffix": "b",
                                                                "n_indent": 10**12}), 400)
    yield Case("overflow-inside-tool-schema", "POST", chat, b'{"messages":[{"role":"user","content":"x"}],'
               b'"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object",'
               b'"properties":{"a":{"type":"number","maximum":1e999}}}}}]}', 400)
    # ---- JSON nested thousands deep: the body, and strings the server parses ----
    for path in (chat, comp, resp, msgs, count, "/infill", "/tokenize", "/apply-template"):
        yield Case(f"deep-body{path.replace('/', '-')}", "POST", path, DEEP_ARRAY.encode(), 400)
    yield Case("deep-body-just-past-limit", "POST", chat, _j({"messages": USER, "metadata": json.loads(JUST_TOO_DEEP)}),
               400)
    yield Case("deep-tool-arguments-chat", "POST", chat, _chat_history(DEEP_ARRAY), 400)
    yield Case("deep-tool-arguments-chat-object", "POST", chat, _chat_history(DEEP_OBJECT), 400)
    yield Case("deep-tool-arguments-apply-template", "POST", "/apply-template",
               _j({"messages": json.loads(_chat_history(DEEP_ARRAY))["messages"]}), 400)
    yield Case("deep-tool-arguments-responses", "POST", resp, _responses_history(DEEP_OBJECT), 400)
    yield Case("overflow-tool-arguments-responses", "POST", resp, _responses_history('{"a": 1e400}'), 400)
    yield Case("nan-tool-arguments-chat", "POST", chat, _chat_history('{"a": NaN}'), 400)
    yield Case("array-tool-arguments-chat", "POST", chat, _chat_history("[1, 2]"), 400)
    yield Case("number-tool-arguments-chat", "POST", chat, _chat_history(5), 400)
    yield Case("broken-tool-arguments-responses", "POST", resp, _responses_history('{"a": '), 400)
    # Anthropic's metadata.user_id is JSON in a string (Claude Code's form) or not: either way no 500
    yield Case("deep-metadata-user-id", "POST", count, _j({"messages": USER, "metadata": {"user_id": DEEP_ARRAY}}),
               200)
    yield Case("open-metadata-user-id", "POST", count,
               _j({"messages": USER, "metadata": {"user_id": '{"session_id":' * 3000}}), 200)
    yield Case("metadata-not-object", "POST", msgs, _messages(metadata=[1]), 400)
    yield Case("metadata-user-id-not-string", "POST", msgs, _messages(metadata={"user_id": {"a": 1}}), 400)
    # ---- the wrong type where the template and grammar layers expect objects or strings ----
    yield Case("tool-parameters-string", "POST", chat,
               _chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]), 400)
    yield Case("tool-description-object", "POST", chat,
               _chat(tools=[{"type": "function", "function": {"name": "f", "description": {"a": 1}}}]), 400)
    yield Case("message-name-object", "POST", chat, _j({"messages": [{"role": "user", "content": "x",
                                                                     "name": {"a": 1}}]}), 400)
    yield Case("tool-call-id-object", "POST", chat, _j({"messages": [
        {"role": "user", "content": "x"}, {"role": "tool", "content": "x", "tool_call_id": [1]}]}), 400)
    yield Case("reasoning-content-number", "POST", chat, _j({"messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "reasoning_content": 5},
        {"role": "user", "content": "z"}]}), 400)
    for name in ("messages", "tools", "add_generation_prompt", "bos_token"):
        yield Case(f"template-kwargs-{name}", "POST", "/apply-template",
                   _j({"messages": USER, "chat_template_kwargs": {name: 1}}), 400)
    yield Case("template-kwargs-array", "POST", chat, _chat(chat_template_kwargs=[1]), 400)
    yield Case("response-format-schema-string", "POST", chat,
               _chat(response_format={"type": "json_schema", "json_schema": {"schema": "x"}}), 400)
    yield Case("responses-text-format-schema-list", "POST", resp,
               _j({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": []}}}), 400)
    yield Case("responses-reasoning-effort-number", "POST", resp, _j({"input": "hi", "reasoning": {"effort": 5}}), 400)
    yield Case("responses-tools-parameters-list", "POST", resp,
               _j({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": [1]}]}), 400)
    yield Case("messages-tool-input-string", "POST", msgs, _j({"max_tokens": 2, "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}]}), 400)
    yield Case("messages-input-schema-string", "POST", msgs, _messages(tools=[{"name": "f", "input_schema": "x"}]),
               400)
    yield Case("messages-system-number", "POST", count, _j({"messages": USER, "system": 5}), 400)
    yield Case("infill-extra-not-list", "POST", "/infill", _j({"input_prefix": "a", "input_extra": {"a": 1}}), 400)
    yield Case("tokenize-content-list", "POST", "/tokenize", _j({"content": ["a"]}), 400)
    yield Case("detokenize-tokens-strings", "POST", "/detokenize", _j({"tokens": ["a"]}), 400)
    yield Case("completions-prompt-object", "POST", comp, _j({"prompt": {"a": 1}}), 400)
    # ---- bytes that are not JSON, or not text ----
    for path in (chat, resp, msgs, count, "/infill", "/tokenize"):
        yield Case(f"non-utf8{path.replace('/', '-')}", "POST", path, b'{"messages": "\xc3\x28\xff"}', 400)
    yield Case("lone-surrogate", "POST", chat, b'{"messages":[{"role":"user","content":"a\\ud800b"}]}', 400)
    yield Case("nul-bytes", "POST", comp, b"\x00" * 64, 400)
    yield Case("empty-body", "POST", resp, b"", 400)
    yield Case("truncated", "POST", msgs, b'{"max_tokens": 2, "messages": [', 400)
    yield Case("body-is-array", "POST", count, b"[]", 400)
    yield Case("form-encoded", "POST", chat, b"messages=hi", 415, "application/x-www-form-urlencoded")
    yield Case("too-large", "POST", chat, b'{"messages": "' + b"a" * (5 * 1024 * 1024) + b'"}', 413)
    # ---- other routes ----
    yield Case("unknown-response-id", "GET", "/v1/responses/resp_" + "f" * 32, None, 404)
    # OpenAI's answer: 400 previous_response_not_found
    yield Case("unknown-previous-response", "POST", resp, _j({"input": "hi", "previous_response_id": "resp_x" * 50}),
               400)
    yield Case("delete-unknown-session", "DELETE", "/v1/sessions/" + "s" * 129, None, 400)
    yield Case("unknown-model", "GET", "/v1/models/%00%ff", None, 404)
    yield Case("wrong-method", "PUT", "/v1/sessions", b"{}", 405)
    # found by the fuzzer: an input item whose `type` is not a string (was a 500: unhashable list)
    yield Case("responses-item-type-list", "POST", resp, _j({"input": [{"type": [], "call_id": "c1"}]}), 400)
    yield Case("responses-item-type-object", "POST", resp, _j({"input": [{"type": {"a": 1}}]}), 400)
    # llama.cpp's /completion, as Continue's llama.cpp provider sends it
    yield Case("completion-overflow", "POST", "/completion", b'{"prompt":"hi","temperature":1e400}', 400)
    yield Case("completion-nan", "POST", "/completion", b'{"prompt":"hi","top_p":NaN}', 400)
    yield Case("completion-deep-prompt", "POST", "/completion", ('{"prompt":' + DEEP_ARRAY + "}").encode(), 400)
    yield Case("completion-bad-sampler", "POST", "/completion", _j({"prompt": "hi", "samplers": [{"a": 1}]}), 400)
    yield Case("completion-unknown-field", "POST", "/completion", _j({"prompt": "hi", "n_tokens_wrong": 1}), 400)


CASES: list[Case] = list(_cases())
