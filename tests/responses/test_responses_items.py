"""Every input item type of the Responses API reference is handled or refused with a 400 that
names it; namespace tools (Codex's MCP servers, sub-agents) and freeform (custom) tools are
offered to the model as functions and their calls come back under the names the client expects."""

from __future__ import annotations

import logging

import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from app.http.errors import APIError
from app.openai.responses.protocol import ToolRef, items_to_messages, parse_responses_request, prompt_names
from app.openai.responses.serving import OutputWriter
from app.output import ContentDelta, ToolArgumentsDelta, ToolCallStart

EVENTS = TypeAdapter(ResponseStreamEvent)

# Every item type of the Responses API's `input` (OpenAI's reference), with an example of it.
HANDLED = {
    "message": {"type": "message", "role": "user", "content": "Hi"},
    "function_call": {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    "function_call_output": {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    "custom_tool_call": {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch",
                         "input": "*** Begin Patch\n*** End Patch"},
    "custom_tool_call_output": {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done!"},
    "local_shell_call": {"type": "local_shell_call", "call_id": "c3", "status": "completed",
                         "action": {"type": "exec", "command": ["ls", "-la"], "env": {}}},
    "local_shell_call_output": {"type": "local_shell_call_output", "id": "c3", "output": "total 0"},
    "shell_call": {"type": "shell_call", "call_id": "c4", "action": {"commands": ["pwd"]}},
    "shell_call_output": {"type": "shell_call_output", "call_id": "c4", "output": [{"type": "input_text",
                                                                                     "text": "/"}]},
    "apply_patch_call": {"type": "apply_patch_call", "call_id": "c5",
                         "operation": {"type": "update_file", "path": "a.py", "diff": "-x\n+y"}},
    "apply_patch_call_output": {"type": "apply_patch_call_output", "call_id": "c5", "output": "applied"},
    "computer_call": {"type": "computer_call", "call_id": "c6", "action": {"type": "click", "x": 1, "y": 2}},
    "computer_call_output": {"type": "computer_call_output", "call_id": "c6",
                             "output": {"type": "computer_screenshot", "image_url": "data:,"}},
    "mcp_call": {"type": "mcp_call", "id": "c7", "name": "lookup", "arguments": "{}", "server_label": "s",
                 "output": "42"},
    "reasoning": {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
    "web_search_call": {"type": "web_search_call", "status": "completed", "action": {"type": "search", "query": "q"}},
    "file_search_call": {"type": "file_search_call", "queries": ["q"], "status": "completed"},
    "image_generation_call": {"type": "image_generation_call", "status": "completed", "result": "AAAA"},
    "code_interpreter_call": {"type": "code_interpreter_call", "code": "1+1", "status": "completed"},
    "mcp_list_tools": {"type": "mcp_list_tools", "server_label": "s", "tools": []},
    "mcp_approval_request": {"type": "mcp_approval_request", "server_label": "s", "name": "t", "arguments": "{}"},
    "mcp_approval_response": {"type": "mcp_approval_response", "approval_request_id": "a", "approve": True},
    "tool_search_call": {"type": "tool_search_call", "status": "completed"},
    "tool_search_output": {"type": "tool_search_output", "tools": []},
    "compaction": {"type": "compaction", "encrypted_content": "gAAAA..."},
    "compaction_summary": {"type": "compaction_summary", "encrypted_content": "gAAAA..."},
}
REFUSED = {
    "item_reference": {"type": "item_reference", "id": "msg_1"},
}
# Content part types of a message's content
PARTS = {
    "input_text": {"type": "input_text", "text": "a"},
    "output_text": {"type": "output_text", "text": "a"},
    "refusal": {"type": "refusal", "refusal": "no"},
    "input_image": {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
    "input_file": {"type": "input_file", "filename": "report.pdf", "file_data": "data:application/pdf;base64,AA"},
    "input_audio": {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
}


@pytest.mark.parametrize("kind", sorted(HANDLED))
def test_every_handled_item_type_is_accepted(kind):
    r = parse_responses_request({"input": [HANDLED[kind], {"role": "user", "content": "go on"}]})
    # (a reasoning item joins the next assistant turn; here there is none)
    assert r.messages[-1] == {"role": "user", "content": "go on"}
    assert len(r.messages) >= (1 if kind == "reasoning" else 2)


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_item_references_are_left_to_the_store(kind):
    """An item_reference is resolved from the stored responses (serving.py), then read."""
    r = parse_responses_request({"input": [{"role": "user", "content": "a"}, REFUSED[kind]]})
    assert r.messages == [] and r.referring_input[1] == REFUSED[kind]
    with pytest.raises(APIError) as e:
        parse_responses_request({"input": [{"type": "item_reference", "id": 5}]})
    assert e.value.status == 400 and e.value.param == "input[0].id"


@pytest.mark.parametrize("kind", sorted(PARTS))
def test_every_content_part_type_is_accepted(kind, caplog):
    with caplog.at_level(logging.WARNING, logger="etserve"):
        r = parse_responses_request({"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "Look: "}, PARTS[kind]]}]})
    text = r.messages[0]["content"]
    assert text.startswith("Look: ") and len(text) > len("Look: ")
    if kind in ("input_image", "input_file", "input_audio"):
        assert "this model reads text only" in text and "AAAA" not in text
        if kind == "input_file":
            assert "report.pdf" in text


def test_codex_history_with_an_image_and_an_apply_patch_call_becomes_tool_turns():
    body = {"tools": [{"type": "custom", "name": "apply_patch", "description": "Edit files.",
                       "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch"}}],
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Fix this:"},
                                             {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]},
                {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch"},
                {"type": "custom_tool_call_output", "call_id": "c1", "output": "Success."},
                {"type": "local_shell_call", "call_id": "c2", "status": "completed",
                 "action": {"type": "exec", "command": ["pytest"]}},
                {"type": "local_shell_call_output", "id": "c2", "output": "1 passed"},
                {"role": "user", "content": "Thanks"}]}
    r = parse_responses_request(body)
    assert r.messages[0]["content"].startswith("Fix this:[image:")
    assert r.messages[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "apply_patch", "arguments": {"input": "*** Begin Patch"}}},
    ]}
    assert r.messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "Success.", "name": "apply_patch"}
    assert r.messages[3]["tool_calls"][0]["function"] == {"name": "local_shell", "arguments": {
        "type": "exec", "command": ["pytest"]}}
    assert r.messages[4]["content"] == "1 passed" and r.messages[5]["content"] == "Thanks"
    # the custom tool is offered as a function of one string argument, its grammar in the description
    (tool,) = r.tools
    assert tool["function"]["name"] == "apply_patch"
    assert tool["function"]["parameters"]["required"] == ["input"]
    assert "start: begin_patch" in tool["function"]["parameters"]["properties"]["input"]["description"]


def test_namespace_tools_are_offered_by_name_and_qualified_only_where_names_clash():
    ns = lambda name, *fns: {"type": "namespace", "name": name, "description": "d",  # noqa: E731
                             "tools": [{"type": "function", "name": f, "parameters": {"type": "object"}} for f in fns]}
    r = parse_responses_request({"input": "x", "tools": [
        {"type": "function", "name": "exec_command"}, ns("mcp__codeword", "lookup_code_word", "search"),
        ns("mcp__docs", "search"), {"type": "web_search"}]})
    assert [t["function"]["name"] for t in r.tools] == [
        "exec_command", "lookup_code_word", "mcp__codeword__search", "mcp__docs__search"]
    assert r.tool_refs["lookup_code_word"] == ToolRef("function", "lookup_code_word", "mcp__codeword")
    assert r.tool_refs["mcp__docs__search"] == ToolRef("function", "search", "mcp__docs")
    # a call Codex resends (with its namespace) reads back under the name the model was offered
    r2 = parse_responses_request({"input": [
        {"type": "function_call", "call_id": "c", "name": "search", "namespace": "mcp__docs", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "found"}], "tools": r.echo_tools})
    assert r2.messages[0]["tool_calls"][0]["function"]["name"] == "mcp__docs__search"


def run(refs, deltas):
    writer = OutputWriter(refs)
    events = [e for d in deltas for e in writer.push(d)] + writer.finish("completed")
    for n, e in enumerate(events):
        e["sequence_number"] = n
        EVENTS.validate_python(e, strict=False)
    return writer, events


def test_a_namespaced_call_comes_back_with_its_namespace_and_a_custom_call_as_custom_tool_call():
    refs = {"lookup_code_word": ToolRef("function", "lookup_code_word", "mcp__codeword"),
            "apply_patch": ToolRef("custom", "apply_patch")}
    writer, events = run(refs, [ContentDelta("Let me."), ToolCallStart(0, "call_1", "lookup_code_word"),
                                ToolArgumentsDelta(0, '{"topic": "x"}'), ToolCallStart(1, "call_2", "apply_patch"),
                                ToolArgumentsDelta(1, '{"input": "*** Begin'), ToolArgumentsDelta(1, ' Patch"}')])
    call, custom = writer.output[1], writer.output[2]
    assert call["type"] == "function_call" and call["name"] == "lookup_code_word"
    assert call["namespace"] == "mcp__codeword" and call["arguments"] == '{"topic": "x"}'
    assert custom == {"id": custom["id"], "type": "custom_tool_call", "status": "completed", "call_id": "call_2",
                      "name": "apply_patch", "input": "*** Begin Patch"}
    kinds = [e["type"] for e in events]
    assert "response.custom_tool_call_input.done" in kinds
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert done[-1]["item"]["input"] == "*** Begin Patch"
    # and the output replays as the next turn's history, under the names the model knows
    history = items_to_messages(writer.output, "output", prompt_names(refs))
    assert [c["function"]["name"] for c in history[0]["tool_calls"]] == ["lookup_code_word", "apply_patch"]
    assert history[0]["tool_calls"][1]["function"]["arguments"] == {"input": "*** Begin Patch"}
