"""The Messages API's request parsing and content blocks: pure logic, no model.

claude_code_request.json is the first request Claude Code 2.1.332 sent (`claude -p "Reply with
one word: hello" --model qwen`), captured on 2026-11-30 (device id zeroed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from anthropic.types import Message, RawMessageStreamEvent
from app.anthropic.protocol import parse_count_tokens_request, parse_messages_request
from app.anthropic.serving import ContentBlocks, thinking_signature
from app.http.errors import APIError
from app.output import ContentDelta, ReasoningDelta, ToolArgumentsDelta, ToolCallStart

CLAUDE_CODE = json.loads((Path(__file__).parent / "claude_code_request.json").read_text())
USER = [{"role": "user", "content": "hi"}]


def parse(**body):
    return parse_messages_request({"max_tokens": 16, "messages": USER, **body})


def refused(body: dict) -> APIError:
    with pytest.raises(APIError) as e:
        parse_messages_request(body)
    assert e.value.status == 400 and e.value.message
    return e.value


def test_claude_codes_request_is_accepted_whole():
    r = parse_messages_request(CLAUDE_CODE)
    assert r.stream and r.max_tokens == 32000 and r.params.max_tokens is None
    # system: the three text blocks, then the role-"system" message Claude Code puts after the user turn
    assert [m["role"] for m in r.messages] == ["system", "user"]
    system = r.messages[0]["content"]
    billing, *blocks = CLAUDE_CODE["system"]
    assert billing["text"].startswith("x-anthropic-billing-header:")
    assert "billing" not in system and system.startswith(blocks[0]["text"])  # telemetry, left out
    for block in [*blocks, *CLAUDE_CODE["messages"][1]["content"]]:
        assert block["text"] in system
    assert system.index(CLAUDE_CODE["system"][2]["text"]) < system.index("# Environment")
    assert r.messages[1]["content"].endswith("Reply with one word: hello")
    assert [t["function"]["name"] for t in r.tools] == [t["name"] for t in CLAUDE_CODE["tools"]]
    assert r.tools[1]["function"]["parameters"] == CLAUDE_CODE["tools"][1]["input_schema"]
    assert r.tool_choice == "auto" and r.parallel_tool_calls
    assert r.session_id == "5b83b9dc-ceea-46f4-97c4-37b1930ce6a3"  # from metadata.user_id
    assert r.template_kwargs == {}  # thinking "adaptive": the model decides


def test_only_a_leading_billing_header_line_is_left_out():
    header = "x-anthropic-billing-header: cc_version=2.1.332.8ef; cc_entrypoint=cli; cch=71fea;"
    assert parse(system=header + "\nYou are terse.").messages[0]["content"] == "You are terse."
    assert parse(system=[{"type": "text", "text": header}, {"type": "text", "text": "Hi."}]
                 ).messages[0]["content"] == "Hi."
    kept = "Quote: x-anthropic-billing-header: is a line Claude Code sends."
    assert parse(system=kept).messages[0]["content"] == kept
    inside = parse(messages=[*USER, {"role": "system", "content": header}]).messages[0]["content"]
    assert inside == header  # only the top-level system is Claude Code's


def test_tool_use_and_tool_result_become_tool_calls_and_tool_messages():
    r = parse(messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should call it.", "signature": "x"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]},
            {"type": "tool_result", "tool_use_id": "toolu_9", "content": "boom", "is_error": True},
            {"type": "text", "text": "Thanks", "cache_control": {"type": "ephemeral"}}]},
    ])
    assert r.messages == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "I should call it.",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "name": "get_weather", "content": "18C"},
        {"role": "tool", "tool_call_id": "toolu_9", "content": "Error: boom"},
        {"role": "user", "content": "Thanks"},
    ]


def test_a_user_turn_of_only_tool_results_adds_no_empty_user_message():
    r = parse(messages=[{"role": "user", "content": "x"},
                        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a"}]}])
    assert [m["role"] for m in r.messages] == ["user", "assistant", "tool"]
    assert r.messages[1]["content"] is None


def test_tools_choices_and_server_tools():
    tools = [{"name": "f", "description": "F", "input_schema": {"type": "object"}, "cache_control": {"type": "x"},
              "defer_loading": True},
             {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
             {"type": "custom", "name": "g", "input_schema": {"type": "object"}}]
    r = parse(tools=tools)
    assert [t["function"]["name"] for t in r.tools] == ["f", "g"]  # the server tool is left out
    assert r.tools[0] == {"type": "function", "function": {"name": "f", "parameters": {"type": "object"},
                                                          "description": "F"}}
    assert (parse(tools=tools, tool_choice={"type": "any"}).tool_choice) == "required"
    forced = parse(tools=tools, tool_choice={"type": "tool", "name": "g"})
    assert (forced.tool_choice, forced.forced_tool, forced.parallel_tool_calls) == ("function", "g", False)
    single = parse(tools=tools, tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert (single.tool_choice, single.parallel_tool_calls) == ("auto", False)
    none = parse(tools=tools, tool_choice={"type": "none"})
    assert none.tool_choice == "none" and none.tools is None


def test_thinking_output_config_and_metadata():
    assert parse(thinking={"type": "disabled"}).template_kwargs == {"enable_thinking": False}
    assert parse(thinking={"type": "enabled", "budget_tokens": 1024}, max_tokens=2048).template_kwargs == {
        "enable_thinking": True}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert parse(output_config={"effort": "low", "format": {"type": "json_schema", "schema": schema}}
                 ).response_format.schema == schema
    assert parse(metadata={"user_id": "user_abc_account__session_1234-abcd"}).session_id == "1234-abcd"
    assert parse(metadata={"user_id": "plain"}).session_id is None


def test_count_tokens_takes_no_max_tokens():
    assert parse_count_tokens_request({"messages": USER}).max_tokens is None
    assert refused({"messages": USER}).param == "max_tokens"


@pytest.mark.parametrize("body, param", [
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0]"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "a", "content": [{"type": "document"}]}]}]},
     "messages[0].content[0].content[0]"),
    ({"max_tokens": 8, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f"}]}]},
     "messages[0].content[0]"),
    ({"max_tokens": 8, "messages": USER, "temperature": 1.5}, "temperature"),
    ({"max_tokens": -1, "messages": USER}, "max_tokens"),
    ({"max_tokens": 8, "messages": USER, "frequency_penalty": 1}, "frequency_penalty"),
    ({"max_tokens": 8, "messages": USER, "tool_choice": {"type": "any"}}, "tool_choice"),
    ({"max_tokens": 8, "messages": USER, "tools": [{"name": "f", "input_schema": {}}],
      "tool_choice": {"type": "tool", "name": "g"}}, "tool_choice.name"),
    ({"max_tokens": 8, "messages": USER, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"max_tokens": 8, "messages": USER, "stop_sequences": "x"}, "stop_sequences"),
    ({"max_tokens": 8, "messages": USER, "thinking": {"type": "maybe"}}, "thinking.type"),
    ({"max_tokens": 8, "messages": USER, "metadata": {"user_id": 5}}, "metadata.user_id"),
    ({"max_tokens": 8, "messages": USER, "mcp_servers": [{"url": "x"}]}, "mcp_servers"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "only system"}]}, "messages"),
])
def test_refusals_name_the_field(body, param):
    assert refused(body).param == param


def replay(events) -> list[dict]:
    """The content an Anthropic client accumulates from the stream events."""
    content: list[dict] = []
    arguments: dict[int, str] = {}
    for e in events:
        data = e.data
        TypeAdapter(RawMessageStreamEvent).validate_python(data)
        if data["type"] == "content_block_start":
            assert data["index"] == len(content)
            content.append(json.loads(json.dumps(data["content_block"])))
        elif data["type"] == "content_block_delta":
            block, delta = content[data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                arguments[data["index"]] = arguments.get(data["index"], "") + delta["partial_json"]
    for index, text in arguments.items():
        content[index]["input"] = json.loads(text)
    return content


def test_content_blocks_stream_folds_to_the_whole_content():
    deltas = [ReasoningDelta("Let me "), ReasoningDelta("think."), ContentDelta("Calling "), ContentDelta("now."),
              ToolCallStart(0, "call_abc", "get_weather"), ToolArgumentsDelta(0, '{"city": '),
              ToolArgumentsDelta(0, '"Paris"}'), ToolCallStart(1, "call_def", "noop"), ToolArgumentsDelta(1, "{}")]
    blocks = ContentBlocks()
    events = [e for d in deltas for e in blocks.push(d)] + blocks.finish()
    assert blocks.blocks == [
        {"type": "thinking", "thinking": "Let me think.", "signature": thinking_signature("Let me think.")},
        {"type": "text", "text": "Calling now."},
        {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_def", "name": "noop", "input": {}},
    ]
    assert replay(events) == blocks.blocks  # the signature arrives as a signature_delta, as Anthropic's does
    assert blocks.blocks[0]["signature"].startswith("etserve:")
    starts = [e.data["index"] for e in events if e.name == "content_block_start"]
    stops = [e.data["index"] for e in events if e.name == "content_block_stop"]
    assert starts == stops == [0, 1, 2, 3]
    Message.model_validate({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                            "content": blocks.blocks, "stop_reason": "tool_use", "stop_sequence": None,
                            "usage": {"input_tokens": 1, "output_tokens": 2}})


def test_consecutive_turns_of_one_role_are_one_turn():
    """Anthropic combines consecutive user (or assistant) turns into one: two assistant messages at
    the end are one prefill; a turn that made tool calls still ends there."""
    r = parse(messages=[{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text", "text": "b"}]},
                        {"role": "assistant", "content": "x"}, {"role": "assistant", "content": "y"}])
    assert r.messages == [{"role": "user", "content": "a\n\nb"}, {"role": "assistant", "content": "xy"}]
    call = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}
    r = parse(messages=[{"role": "user", "content": "go"},
                        {"role": "assistant", "content": [{"type": "text", "text": "Let me "}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "call."}, call]},
                        {"role": "assistant", "content": "After."},
                        {"role": "user", "content": [result]}, {"role": "user", "content": "thanks"}])
    assert [(m["role"], m.get("content")) for m in r.messages] == [
        ("user", "go"), ("assistant", "Let me call."), ("assistant", "After."), ("tool", "42"), ("user", "thanks")]
    assert r.messages[1]["tool_calls"][0]["function"]["name"] == "f"
