"""POST /v1/responses driven by the official openai SDK against real gunicorn with a real model:
whole and streamed responses, every event validated against the SDK's own types, the store,
previous_response_id, a function-call round trip, errors in the OpenAI envelope."""

from __future__ import annotations

import json

import openai
import pytest
import requests
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

EVENTS = TypeAdapter(ResponseStreamEvent)
MODEL = "any-name-the-client-likes"  # a single-model server answers whatever name is sent
QUESTION = "Name three colors of the rainbow."
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat_text(server, messages, max_tokens):
    """The same conversation through /v1/chat/completions, greedy: the shared pipeline's answer."""
    r = requests.post(server.base_url + "/v1/chat/completions", timeout=120, json={
        "messages": messages, "max_tokens": max_tokens, "temperature": 0}).json()
    return r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"], r["usage"]


def raw_events(server, body: dict) -> list[tuple[str, dict]]:
    """The stream as sent: (the `event:` name, the parsed data) of every event."""
    with requests.post(server.base_url + "/v1/responses", json={**body, "stream": True}, stream=True,
                       timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        out, name = [], None
        for line in r.iter_lines(decode_unicode=True):
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                assert name is not None, "every data line follows its event line"
                out.append((name, json.loads(line[len("data: "):])))
                name = None
    return out


def check_sequence(events: list[tuple[str, dict]]) -> None:
    """Each event validates against the SDK's types, is named after its type, and is numbered in order."""
    for n, (name, data) in enumerate(events):
        assert name == data["type"]
        assert data["sequence_number"] == n, (n, data)
        EVENTS.validate_python(data)
    assert [d["type"] for _, d in events[:2]] == ["response.created", "response.in_progress"]


def test_create_matches_chat_and_validates(client, server):
    expected, finish, usage = chat_text(server, [{"role": "user", "content": QUESTION}], 24)
    r = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=24, temperature=0)
    Response.model_validate(r.model_dump(mode="json", exclude_unset=True))
    assert r.object == "response" and r.id.startswith("resp_") and r.model == server.health()["model"]
    assert r.output_text == expected
    assert r.status == ("incomplete" if finish == "length" else "completed")
    if finish == "length":
        assert r.incomplete_details.reason == "max_output_tokens"
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert r.usage.input_tokens == usage["prompt_tokens"] and r.usage.output_tokens == usage["completion_tokens"]
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert 0 <= r.usage.input_tokens_details.cached_tokens < r.usage.input_tokens


def test_output_text_logprobs_when_included(client, server):
    """include ["message.output_text.logprobs"] and top_logprobs: the output_text part carries
    its tokens' logprobs (their bytes are its text, as chat's logprobs are), with the alternatives
    asked for; a stream's text deltas carry the same entries between them; without the include,
    none."""
    body = dict(model=MODEL, input=QUESTION, max_output_tokens=12, temperature=0,
                include=["message.output_text.logprobs"], top_logprobs=2)
    r = client.responses.create(**body)
    Response.model_validate(r.model_dump(mode="json", exclude_unset=True))
    part = r.output[0].content[0]
    assert part.logprobs and bytes(b for lp in part.logprobs for b in lp.bytes).decode() == part.text
    assert all(lp.logprob <= 0 and len(lp.top_logprobs) == 2 for lp in part.logprobs)
    assert r.top_logprobs == 2
    chat = requests.post(server.base_url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 12, "temperature": 0,
        "logprobs": True, "top_logprobs": 2}).json()["choices"][0]["logprobs"]["content"]
    assert [lp.token for lp in part.logprobs] == [c["token"] for c in chat]
    events = raw_events(server, {k: v for k, v in body.items() if k != "model"})
    check_sequence(events)
    streamed = [lp for _, d in events if d["type"] == "response.output_text.delta" for lp in d["logprobs"]]
    assert [lp["token"] for lp in streamed] == [lp.token for lp in part.logprobs]
    done = next(d for _, d in events if d["type"] == "response.output_text.done")
    assert [lp["token"] for lp in done["logprobs"]] == [lp.token for lp in part.logprobs]
    plain = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=4, temperature=0)
    assert plain.output[0].content[0].logprobs == []
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input=QUESTION, top_logprobs=21)


def test_top_p_0_is_the_best_token(client):
    """OpenAI's range is 0-1: top_p 0 keeps the best token only, whatever the temperature."""
    greedy = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=8, temperature=0)
    r = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=8, temperature=1.5, top_p=0)
    assert r.output_text == greedy.output_text and r.top_p == 0


def test_max_output_tokens_gives_incomplete(client):
    r = client.responses.create(model=MODEL, input="Count from one to fifty in words.", max_output_tokens=3, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"


def test_raw_stream_is_the_full_typed_sequence(server):
    body = {"input": [{"role": "developer", "content": "Answer briefly."},
                      {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}],
            "max_output_tokens": 20, "temperature": 0}
    whole = requests.post(server.base_url + "/v1/responses", json=body, timeout=120).json()
    events = raw_events(server, body)
    check_sequence(events)
    kinds = [d["type"] for _, d in events]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] == ("response.completed" if whole["status"] == "completed" else "response.incomplete")
    deltas = "".join(d["delta"] for _, d in events if d["type"] == "response.output_text.delta")
    assert deltas == events[-4][1]["text"] == events[-1][1]["response"]["output_text"] == whole["output_text"]
    assert events[0][1]["response"]["status"] == "in_progress" and events[0][1]["response"]["output"] == []
    final = events[-1][1]["response"]
    assert final["id"] == events[0][1]["response"]["id"] and final["usage"]["output_tokens"] > 0


def test_sdk_stream_helper_accumulates_every_event(client):
    with client.responses.stream(model=MODEL, input=QUESTION, max_output_tokens=16, temperature=0) as stream:
        seen = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.output_text.delta" in seen and seen[-1] in ("response.completed", "response.incomplete")
    assert final.output_text and final.output[0].content[0].text == final.output_text


def test_unrunnable_tool_types_are_accepted(client):
    r = client.responses.create(
        model=MODEL, input="Say hi.", max_output_tokens=4, temperature=0, tools=[
            WEATHER, {"type": "web_search"},
            {"type": "namespace", "name": "multi_agent_v1", "description": "x", "tools": []},
            {"type": "local_shell"}, {"type": "custom", "name": "apply_patch"},
            {"type": "file_search", "vector_store_ids": ["v"]}],
        tool_choice="auto", parallel_tool_calls=True, reasoning={"summary": "auto"},
        include=["reasoning.encrypted_content"], store=False, prompt_cache_key="conv-unrunnable",
        metadata={"k": "v"}, user="u", service_tier="auto", truncation="disabled",
        extra_body={"client_metadata": {"session_id": "x"}})
    assert r.status in ("completed", "incomplete")
    # the tools the model is offered are echoed: functions, a namespace's and a custom tool's
    assert [t.type for t in r.tools] == ["function", "namespace", "custom"] and r.prompt_cache_key == "conv-unrunnable"


def test_forced_function_call_round_trip(client):
    first = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60,
                                    temperature=0)
    calls = [i for i in first.output if i.type == "function_call"]
    assert len(calls) == 1 and first.status == "completed", first.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert isinstance(json.loads(call.arguments)["city"], str)
    # The client runs the tool and sends the result back (the whole history: store is not needed).
    second = client.responses.create(
        model=MODEL, input=[{"role": "user", "content": "What is the weather in Paris?"}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 degrees."}],
        tools=[WEATHER], tool_choice="none", max_output_tokens=30, temperature=0, store=False)
    assert second.output[0].type == "message" and second.output_text.strip()
    alone = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice="none", max_output_tokens=1, store=False)
    assert second.usage.input_tokens > alone.usage.input_tokens + 10  # the call and its result are in the prompt
    # ...or continues the stored first response.
    third = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=[WEATHER], tool_choice="none", max_output_tokens=30, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 degrees."}])
    assert third.output_text == second.output_text
    assert third.usage.input_tokens == second.usage.input_tokens


def test_item_references_name_stored_output_items(client):
    """The AI SDK (store on, its default) sends an earlier turn's output back as item references:
    they read as the items themselves; an id not kept here is OpenAI's 404 'Item ... not found'."""
    first = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60,
                                    temperature=0)
    (call,) = [i for i in first.output if i.type == "function_call"]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 degrees."}
    whole = client.responses.create(
        model=MODEL, input=[{"role": "user", "content": "What is the weather in Paris?"}, call.model_dump(exclude_none=True),
                            result], tools=[WEATHER], tool_choice="none", max_output_tokens=30, temperature=0, store=False)
    referred = client.responses.create(
        model=MODEL, input=[{"role": "user", "content": "What is the weather in Paris?"},
                            {"type": "item_reference", "id": call.id}, result],
        tools=[WEATHER], tool_choice="none", max_output_tokens=30, temperature=0)
    assert referred.usage.input_tokens == whole.usage.input_tokens and referred.output_text == whole.output_text
    # an assistant message's id too, in a later turn
    (message,) = [i for i in referred.output if i.type == "message"]
    later = client.responses.create(model=MODEL, max_output_tokens=8, input=[
        {"role": "user", "content": "Hi"}, {"type": "item_reference", "id": message.id}, {"role": "user", "content": "Thanks"}])
    assert later.status in ("completed", "incomplete")
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": "msg_nope"}])
    assert e.value.body["code"] == "item_not_found" and e.value.body["param"] == "input[0].id"


def test_forced_call_streams_arguments_that_concatenate(server):
    events = raw_events(server, {"input": "Weather in Oslo?", "tools": [WEATHER], "tool_choice": "required",
                                 "max_output_tokens": 60, "temperature": 0})
    check_sequence(events)
    kinds = [d["type"] for _, d in events]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    done = next(d for _, d in events if d["type"] == "response.function_call_arguments.done")
    deltas = "".join(d["delta"] for _, d in events if d["type"] == "response.function_call_arguments.delta")
    final_call = next(i for i in events[-1][1]["response"]["output"] if i["type"] == "function_call")
    assert deltas == done["arguments"] == final_call["arguments"] and json.loads(deltas)["city"]


def test_previous_response_id_continues_with_its_kv_state(client, server):
    first = client.responses.create(model=MODEL, input="My name is Ada. Remember it.", instructions="Be brief.",
                                    max_output_tokens=12, temperature=0)
    # instructions are not carried over (as OpenAI): the request repeats them
    second = client.responses.create(model=MODEL, previous_response_id=first.id, input="What is my name?",
                                     instructions="Be brief.", max_output_tokens=12, temperature=0)
    assert second.previous_response_id == first.id
    # the same conversation sent whole gives the same prompt and answer
    history = [{"role": "user", "content": "My name is Ada. Remember it."},
               *[o.model_dump(exclude_none=True) for o in first.output],
               {"role": "user", "content": "What is my name?"}]
    whole = client.responses.create(model=MODEL, input=history, instructions="Be brief.", max_output_tokens=12, temperature=0,
                                    store=False)
    assert whole.usage.input_tokens == second.usage.input_tokens and whole.output_text == second.output_text
    # the second turn read the first turn's prompt from the KV cache
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1


def test_conversation_kv_state_survives_an_interleaved_request(client, server):
    first = client.responses.create(model=MODEL, input="Tell me about the sea in one sentence.", max_output_tokens=16,
                                    temperature=0)
    # another conversation takes the cache meanwhile
    client.responses.create(model=MODEL, input="Something else entirely: list some fruits.", max_output_tokens=16,
                            temperature=0, store=False)
    second = client.responses.create(model=MODEL, previous_response_id=first.id, input="And the sky?", max_output_tokens=8,
                                     temperature=0)
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1


def test_get_and_delete_stored_response(client, server):
    r = client.responses.create(model=MODEL, input="Hi!", max_output_tokens=4, temperature=0)
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(r.id)
    assert e.value.body["code"] == "response_not_found"
    raw = requests.delete(server.base_url + f"/v1/responses/{r.id}", timeout=10)
    assert raw.status_code == 404 and set(raw.json()["error"]) == {"message", "type", "param", "code"}


def test_store_false_is_not_kept(client):
    r = client.responses.create(model=MODEL, input="Hi!", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError) as e:  # OpenAI's answer: 400 previous_response_not_found
        client.responses.create(model=MODEL, previous_response_id=r.id, input="Again")
    assert e.value.body["code"] == "previous_response_not_found" and e.value.body["param"] == "previous_response_id"


@pytest.mark.parametrize("extra, param", [
    ({"frobnicate": 1}, "frobnicate"),
    ({"background": True}, "background"),
    ({"temperature": 3}, "temperature"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "tool_choice"),
    ({"input": [{"type": "item_reference"}]}, "input[0].id"),
    ({"input": "word " * 3000}, "input"),
])
def test_errors_name_the_field(client, extra, param):
    body = {"input": "Hi", **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, **{k: v for k, v in body.items() if k in ("input", "max_output_tokens",
                                   "temperature", "tool_choice", "tools", "background")},
                                extra_body={k: v for k, v in body.items() if k == "frobnicate"})
    assert e.value.status_code == 400 and e.value.body["param"] == param, e.value.body


def test_json_schema_text_format_is_enforced(client):
    schema = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"],
              "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="Pick a color.", max_output_tokens=40, temperature=0,
                                text={"format": {"type": "json_schema", "name": "pick", "schema": schema,
                                                 "strict": True}})
    assert isinstance(json.loads(r.output_text)["color"], str)


def test_fields_the_agent_sdks_send_are_taken(client, server):
    """The Agents SDK's and the AI SDK's settings send these; each changes nothing here (docs/api.md)."""
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, max_tool_calls=3,
                                extra_body={"prompt_cache_options": {}})
    assert r.status in ("completed", "incomplete")
    streamed = requests.post(server.base_url + "/v1/responses", timeout=60, json={
        "input": "Hi", "max_output_tokens": 4, "stream": True, "stream_options": {"include_obfuscation": False}})
    assert streamed.status_code == 200 and "event: response.created" in streamed.text, streamed.text[:300]
    chat = requests.post(server.base_url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "verbosity": "low",
        "prompt_cache_retention": "24h", "prompt_cache_options": {}})
    assert chat.status_code == 200, chat.text
    bad = requests.post(server.base_url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "verbosity": "loud"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "verbosity"
