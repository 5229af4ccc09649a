"""Every content block type of the Messages API reference is handled or refused with a 400 that
names it, in each place it can appear (a user turn, an assistant turn, a tool result)."""

from __future__ import annotations

import logging

import pytest

from app.anthropic.protocol import parse_messages_request
from app.http.errors import APIError

IMG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
USER_BLOCKS = {
    "text": {"type": "text", "text": "a"},
    "image": {"type": "image", "source": IMG},
    "document": {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"},
                 "title": "spec.pdf"},
    "search_result": {"type": "search_result", "source": "https://x", "title": "T",
                      "content": [{"type": "text", "text": "found"}]},
    "tool_result": {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"},
    "thinking": {"type": "thinking", "thinking": "hm", "signature": "s"},
    "redacted_thinking": {"type": "redacted_thinking", "data": "opaque"},
    "container_upload": {"type": "container_upload", "file_id": "file_1"},
}
ASSISTANT_BLOCKS = {
    "text": {"type": "text", "text": "a"},
    "thinking": {"type": "thinking", "thinking": "hm", "signature": "s"},
    "redacted_thinking": {"type": "redacted_thinking", "data": "opaque"},
    "tool_use": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
    "server_tool_use": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}},
    "web_search_tool_result": {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
    "web_fetch_tool_result": {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_1", "content": {}},
    "code_execution_tool_result": {"type": "code_execution_tool_result", "tool_use_id": "srvtoolu_1", "content": {}},
    "bash_code_execution_tool_result": {"type": "bash_code_execution_tool_result", "tool_use_id": "s", "content": {}},
    "text_editor_code_execution_tool_result": {"type": "text_editor_code_execution_tool_result",
                                               "tool_use_id": "s", "content": {}},
    "tool_search_tool_result": {"type": "tool_search_tool_result", "tool_use_id": "s", "content": {}},
    "mcp_tool_use": {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "t", "server_name": "s", "input": {}},
    "mcp_tool_result": {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "content": "x"},
}
TOOL_RESULT_PARTS = {
    "text": {"type": "text", "text": "a"},
    "image": {"type": "image", "source": IMG},
    "document": {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain doc"}},
    "search_result": USER_BLOCKS["search_result"],
    "tool_reference": {"type": "tool_reference", "tool_name": "f"},
}
# Blocks that cannot stand where they are sent: refused, by name
REFUSED = [
    ("user", {"type": "tool_use", "id": "a", "name": "f", "input": {}}, "tool_use"),
    ("user", {"type": "server_tool_use", "id": "a", "name": "f", "input": {}}, "server_tool_use"),
    ("assistant", {"type": "tool_result", "tool_use_id": "a"}, "tool_result"),
    ("user", {"type": "hologram"}, "hologram"),
]


def parse(messages):
    return parse_messages_request({"max_tokens": 64, "messages": messages})


@pytest.mark.parametrize("kind", sorted(USER_BLOCKS))
def test_user_blocks(kind, caplog):
    with caplog.at_level(logging.WARNING, logger="etserve"):
        r = parse([{"role": "assistant", "content": [ASSISTANT_BLOCKS["tool_use"]]},
                   {"role": "user", "content": [USER_BLOCKS[kind], {"type": "text", "text": "and?"}]}])
    assert r.messages[-1]["role"] == "user" and r.messages[-1]["content"].endswith("and?")
    if kind in ("image", "document"):
        assert "this model reads text only" in r.messages[-1]["content"]
        assert "iVBOR" not in r.messages[-1]["content"] and "JVBE" not in r.messages[-1]["content"]
        assert any(kind in rec.getMessage() for rec in caplog.records) or kind in _warned()


def _warned():
    from app.text.unread import _warned
    return {kind for api, kind in _warned if api == "messages"}


@pytest.mark.parametrize("kind", sorted(ASSISTANT_BLOCKS))
def test_assistant_blocks(kind):
    r = parse([{"role": "user", "content": "hi"}, {"role": "assistant", "content": [ASSISTANT_BLOCKS[kind]]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]
                if kind == "tool_use" else "go on"}])
    assert r.messages[1]["role"] == "assistant"


@pytest.mark.parametrize("kind", sorted(TOOL_RESULT_PARTS))
def test_tool_result_parts(kind):
    r = parse([{"role": "user", "content": "hi"}, {"role": "assistant", "content": [ASSISTANT_BLOCKS["tool_use"]]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                             "content": [TOOL_RESULT_PARTS[kind]]}]}])
    assert r.messages[-1]["role"] == "tool" and r.messages[-1]["content"]
    if kind == "document":
        assert r.messages[-1]["content"] == "plain doc"  # a text document is read as text


@pytest.mark.parametrize("role, block, named", REFUSED, ids=[f"{r}-{b['type']}" for r, b, _ in REFUSED])
def test_blocks_that_cannot_stand_there_are_refused_by_name(role, block, named):
    messages = [{"role": "user", "content": "hi"}] if role == "assistant" else []
    with pytest.raises(APIError) as e:
        parse(messages + [{"role": role, "content": [block]}])
    assert e.value.status == 400 and named in e.value.message, e.value.message


def test_developer_and_later_system_messages_join_the_system_prompt():
    r = parse_messages_request({"max_tokens": 8, "system": "Be brief.", "messages": [
        {"role": "user", "content": "hi"}, {"role": "developer", "content": "Answer in French."},
        {"role": "system", "content": [{"type": "text", "text": "Today is Monday."}]}]})
    assert r.messages[0] == {"role": "system", "content": "Be brief.\n\nAnswer in French.\n\nToday is Monday."}
    assert [m["role"] for m in r.messages] == ["system", "user"]


BAD_SEARCH_RESULTS = [
    ({"type": "search_result", "content": 5}, ".content"),
    ({"type": "search_result", "content": [{"type": "text", "text": 7}]}, ".content[0]"),
    ({"type": "search_result", "content": ["found"]}, ".content[0]"),
    ({"type": "search_result", "title": ["T"], "content": []}, ".title"),
]


@pytest.mark.parametrize("block, field", BAD_SEARCH_RESULTS)
@pytest.mark.parametrize("inside", ["user", "tool_result"])
def test_a_malformed_search_result_is_a_400_naming_its_field(block, field, inside):
    """Found by fuzzing: these were 500s (a TypeError joining the texts)."""
    if inside == "user":
        messages, where = [{"role": "user", "content": [block]}], "messages[0].content[0]"
    else:
        messages = [{"role": "assistant", "content": [ASSISTANT_BLOCKS["tool_use"]]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [block]}]}]
        where = None
    with pytest.raises(APIError) as e:
        parse(messages)
    assert e.value.status == 400
    assert e.value.param.endswith(field) and (where is None or e.value.param == where + field), e.value.param
