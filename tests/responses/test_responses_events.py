"""The Responses API's output writer and request parsing, on scripted deltas (pure logic; the
e2e tests in tests/e2e/test_responses_*.py run the same code on a real model): every event
validates against the openai SDK's own types, and the whole response is the fold of the stream."""

from __future__ import annotations

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from app.http.errors import APIError
from app.openai.responses.protocol import ToolRef, items_to_messages, parse_responses_request
from app.openai.responses.serving import OutputWriter
from app.output import ContentDelta, ReasoningDelta, ToolArgumentsDelta, ToolCallStart

EVENTS = TypeAdapter(ResponseStreamEvent)


def run(deltas, status="completed"):
    writer = OutputWriter()
    events = [e for d in deltas for e in writer.push(d)] + writer.finish(status)
    for n, e in enumerate(events):
        e["sequence_number"] = n
        EVENTS.validate_python(e, strict=False)
    return writer, events


def test_reasoning_text_and_calls_become_items_with_every_event():
    writer, events = run([ReasoningDelta("Let me "), ReasoningDelta("think."), ContentDelta("\n"),
                          ContentDelta("Calling."), ToolCallStart(0, "call_1", "f"), ToolArgumentsDelta(0, '{"a"'),
                          ToolArgumentsDelta(0, ": 1}")])
    assert [i["type"] for i in writer.output] == ["reasoning", "message", "function_call"]
    assert writer.output[0]["summary"] == [{"type": "summary_text", "text": "Let me think."}]
    assert writer.output[1]["content"][0]["text"] == "\nCalling."
    assert writer.output[2]["arguments"] == '{"a": 1}' and writer.output[2]["call_id"] == "call_1"
    assert all(i["status"] == "completed" for i in writer.output)
    assert [e["type"] for e in events] == [
        "response.output_item.added", "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta", "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done"]
    # events hold the item as it was when sent
    assert events[0]["item"]["summary"] == [] and events[-1]["item"]["arguments"] == '{"a": 1}'
    assert events[13]["item"]["arguments"] == ""


def test_whitespace_alone_opens_no_message_before_a_call():
    writer, _ = run([ContentDelta("\n"), ToolCallStart(0, "call_1", "f"), ToolArgumentsDelta(0, "{}")])
    assert [i["type"] for i in writer.output] == ["function_call"]


def test_empty_output_is_an_empty_message_and_cut_output_is_incomplete():
    writer, _ = run([])
    assert writer.output[0]["type"] == "message" and writer.output[0]["content"][0]["text"] == ""
    writer, events = run([ContentDelta("One two")], status="incomplete")
    assert writer.output[0]["status"] == "incomplete" and events[-1]["item"]["status"] == "incomplete"


def test_input_items_become_chat_messages():
    body = {"input": [
        {"role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"type": "message", "role": "user", "content": "What is the weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Use the tool."}],
         "encrypted_content": "opaque"},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
    ], "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}},
                 {"type": "web_search"}, {"type": "namespace", "name": "x", "tools": []}],
        "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"], "store": False,
        "prompt_cache_key": "conv-1", "client_metadata": {"a": "b"}}
    r = parse_responses_request(body)
    assert r.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather?"},
        {"role": "assistant", "content": None, "reasoning_content": "Use the tool.",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny", "name": "weather"},
        {"role": "assistant", "content": "Sunny."},
    ]
    assert [t["function"]["name"] for t in r.tools] == ["weather"] and r.session_id == "conv-1"


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "frobnicate": 1}, "frobnicate"),
    ({"input": "x", "background": True}, "background"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_video"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "item_reference"}]}, "input[0].id"),
    ({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": 5}]}, "input[0]"),
    ({"input": [{"type": "local_shell_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input[0].arguments"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "tool_choice": {"type": "web_search"}}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "prompt_cache_key": ""}, "prompt_cache_key"),
    ({}, "input"),
])
def test_bad_requests_name_the_field(body, param):
    with pytest.raises(APIError) as e:
        parse_responses_request(body)
    assert e.value.status == 400 and e.value.param == param


def test_output_items_replay_as_history():
    writer, _ = run([ReasoningDelta("hm"), ContentDelta("Hi"), ToolCallStart(0, "call_9", "f"),
                     ToolArgumentsDelta(0, '{"x": 2}')])
    assert items_to_messages(writer.output, "output") == [
        {"role": "assistant", "content": "Hi", "reasoning_content": "hm",
         "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "f", "arguments": {"x": 2}}}]}]


def test_response_object_validates():
    from app.openai.responses import shapes
    from app.engine import GenerationStats

    r = parse_responses_request({"input": "hi", "tools": [{"type": "function", "name": "f"}]})
    writer, _ = run([ContentDelta("Hello")])
    obj = shapes.response(id="resp_1", created_at=1, model="m", status="completed", output=writer.output, request=r,
                          usage=shapes.usage(GenerationStats(prompt_tokens=5, cached_tokens=2, completion_tokens=1), 0),
                          previous_response_id=None, completed_at=2)
    parsed = Response.model_validate(obj, strict=False)
    assert parsed.output_text == "Hello" and parsed.usage.input_tokens_details.cached_tokens == 2


class _FailingPipeline:
    """A pipeline whose generation fails after its first delta (as a runtime fault would)."""

    cancelled = False

    def __iter__(self):
        yield ContentDelta("Hel")
        raise RuntimeError("boom")


class _FakeChat:
    class model:
        id = "m"

    def prepare(self, request):
        return request

    def pipeline(self, prepared, index, cancel):
        return _FailingPipeline()


def test_an_error_after_the_start_is_response_failed_then_error():
    from app.openai.responses.serving import Responses
    from app.openai.responses.store import ResponseStore

    store = ResponseStore(4)
    service = Responses(_FakeChat(), store)
    prepared = service.prepare(parse_responses_request({"input": "hi"}))
    events = [e.data for e in service.stream(prepared, cancel=None)]
    for e in events:
        EVENTS.validate_python(e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events][-2:] == ["response.failed", "error"]
    failed = events[-2]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert failed["output"][0]["content"][0]["text"] == "Hel"
    assert events[-1]["code"] == "internal_error" and "boom" not in events[-1]["message"]
    assert len(store) == 0
    with pytest.raises(RuntimeError):
        service.complete(prepared, cancel=None)


def test_store_is_a_bounded_lru():
    from app.openai.responses.store import ResponseStore, StoredResponse

    store = ResponseStore(2)
    for i in range(3):
        store.put(StoredResponse({"id": f"r{i}"}, [], "s"))
        if i == 1:
            assert store.get("r0") is not None  # r0 is now the most recent
    assert store.get("r1") is None and store.get("r0") and store.get("r2")
    assert store.delete("r0") and not store.delete("r0")
    assert len(ResponseStore(0)) == 0


def test_codex_request_parses():
    """Codex CLI 0.171.0's first request, as it sent it (recorded): every field, item and tool type
    is accepted; its function tools and the functions of its namespace (sub-agents) reach the
    prompt, the hosted web_search does not."""
    import json
    from pathlib import Path

    body = json.loads((Path(__file__).parent / "recorded" / "codex-0.171.0-first-request.json").read_text())
    r = parse_responses_request(body)
    assert r.stream and not r.store and r.session_id == body["prompt_cache_key"]
    assert [m["role"] for m in r.messages] == ["system", "system", "user", "user"]
    assert {t["function"]["name"] for t in r.tools} == {
        "exec_command", "write_stdin", "request_user_input", "view_image", "get_goal", "create_goal", "update_goal",
        "close_agent", "resume_agent", "send_input", "spawn_agent", "wait_agent"}
    assert r.tool_refs["spawn_agent"] == ToolRef("function", "spawn_agent", "multi_agent_v1")
