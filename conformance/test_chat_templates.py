"""What reaches the chat template: every role, text content parts, chat_template_kwargs; an image
part in a text model's conversation (a chat UI resends a pasted one every turn)."""

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


def test_an_image_part_is_answered_or_refused_naming_the_part(post, model):
    """A model that cannot see answers from the text (etserve: a placeholder stands in for the
    image), or refuses with a 400 naming the part; never a 5xx."""
    parts = [{"type": "text", "text": "What is this?"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]
    r = post("/chat/completions", {"model": model, "messages": [{"role": "user", "content": parts}], "max_tokens": 1})
    if r.status_code == 200:
        assert r.json()["choices"][0]["message"]["role"] == "assistant"
        return
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
