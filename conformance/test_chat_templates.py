"""What reaches the chat template: every role, text content parts, chat_template_kwargs; images refused."""

from __future__ import annotations

import json

TOOL_CALL = {"id": "call_1", "type": "function",
             "function": {"name": "get_time", "arguments": json.dumps({"zone": "UTC"})}}
TOOLS = [{"type": "function", "function": {
    "name": "get_time", "description": "the current time",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}]


def test_every_role_in_one_conversation(post, model):
    messages = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": [{"type": "text", "text": "What time is it "},
                                     {"type": "text", "text": "in UTC?"}]},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
        {"role": "assistant", "content": "It is noon."},
        {"role": "user", "content": "Thanks."},
    ]
    r = post("/chat/completions", {"model": model, "messages": messages, "tools": TOOLS, "max_tokens": 4,
                                   "temperature": 0})
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert message["content"] is None or isinstance(message["content"], str)


def test_image_content_parts_are_refused_naming_the_part(post, model):
    parts = [{"type": "text", "text": "What is this?"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]
    r = post("/chat/completions", {"model": model, "messages": [{"role": "user", "content": parts}], "max_tokens": 1})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith("messages[0].content") and error["message"] and error["type"]


def test_chat_template_kwargs_are_accepted(post, model):
    r = post("/chat/completions", {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                                   "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert "<think>" not in (message["content"] or "")
    assert isinstance(message.get("reasoning_content", ""), str)
