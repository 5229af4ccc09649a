"""The Messages API through the official anthropic SDK, against a real server.

Every response and stream event is also validated strictly against the SDK's own pydantic
types (the SDK itself builds its objects without validation), so a missing or mistyped field
fails here."""

from __future__ import annotations

import json
import threading
import time
import uuid

import anthropic
import pytest
import requests
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from pydantic import TypeAdapter

from . import agents
from .streams import LONG

HELLO = [{"role": "user", "content": "Count from one to ten in words, separated by spaces."}]
GREEDY = {"temperature": 0}  # the SDK no longer names temperature; the API still takes it
EVENTS = TypeAdapter(RawMessageStreamEvent)


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def post(srv, body: dict, path: str = "/v1/messages", **kw) -> requests.Response:
    return requests.post(srv.base_url + path, json=body, timeout=120, **kw)


def sse(r: requests.Response) -> list[tuple[str, dict]]:
    """(event name, data) of each event; every data line must follow its event line and be JSON
    (so no OpenAI-style `data: [DONE]`)."""
    events, name = [], None
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            assert name is not None, line
            data = json.loads(line[len("data: "):])
            assert data["type"] == name
            events.append((name, data))
            name = None
    return events


def test_create_returns_a_valid_message(client, server):
    m = client.messages.create(model="anything", max_tokens=12, messages=HELLO, extra_body=GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.model == agents.served_model(server)[0]
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert m.content and m.content[0].type == "text" and m.content[0].text
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens > 0 and 0 < m.usage.output_tokens <= 12
    raw = post(server, {"model": "x", "max_tokens": 12, "messages": HELLO, **GREEDY})
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("application/json")
    Message.model_validate(raw.json())
    # Anthropic's request-id header, which the SDK exposes
    assert m._request_id and raw.headers["request-id"] == raw.headers["x-request-id"]
    assert client.models.with_raw_response.list().request_id  # the SDK reads it on /v1/models too
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=-1, messages=HELLO)
    assert e.value.request_id


def test_stream_events_validate_and_fold_to_the_non_streamed_message(client, server):
    whole = client.messages.create(model="m", max_tokens=16, messages=HELLO, extra_body=GREEDY)
    with client.messages.stream(model="m", max_tokens=16, messages=HELLO, extra_body=GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert [c.model_dump() for c in final.content] == [c.model_dump() for c in whole.content]
    assert (final.stop_reason, final.stop_sequence) == (whole.stop_reason, whole.stop_sequence)
    assert final.usage.output_tokens == whole.usage.output_tokens
    total = lambda m: m.usage.input_tokens + m.usage.cache_read_input_tokens  # noqa: E731
    assert total(final) == total(whole)
    assert any(e.type == "text" for e in events)  # the SDK's text helper events
    # the wire: every event validates against the SDK's types, in Anthropic's order
    raw = post(server, {"model": "m", "max_tokens": 16, "messages": HELLO, "stream": True, **GREEDY}, stream=True)
    assert raw.headers["content-type"].startswith("text/event-stream")
    wire = sse(raw)
    for _, data in (e for e in wire if e[0] != "ping"):
        EVENTS.validate_python(data)
    names = [n for n, _ in wire]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert names[2] == "content_block_start" and names[-3] == "content_block_stop"
    assert "".join(d["delta"]["text"] for n, d in wire if n == "content_block_delta") == whole.content[0].text
    assert wire[-2][1]["usage"]["output_tokens"] == whole.usage.output_tokens


def test_beta_query_is_answered(client):
    m = client.beta.messages.create(model="m", max_tokens=4, messages=HELLO, extra_body=GREEDY)
    assert m.content[0].text


def test_max_tokens_and_stop_sequences(client):
    m = client.messages.create(model="m", max_tokens=3, messages=HELLO, extra_body=GREEDY)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3
    text = client.messages.create(model="m", max_tokens=24, messages=HELLO, extra_body=GREEDY).content[0].text
    stop = text[len(text) // 2:][:3]  # a piece of the greedy text, which the same request then stops at
    assert len(stop) == 3, text
    cut = client.messages.create(model="m", max_tokens=24, messages=HELLO, stop_sequences=["zzz", stop],
                                 extra_body=GREEDY)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[:text.index(stop)]


def test_a_final_assistant_message_is_continued(client, server):
    """A prefill: the prompt ends inside the assistant's turn, after its text (no end of turn, no
    new turn), and the reply is the greedy continuation of exactly that prompt, as /completion
    gives it; a prefill ending in whitespace is refused, as Anthropic does."""
    prefill = [*HELLO, {"role": "assistant", "content": [{"type": "text", "text": "one two three"}]}]
    prompt = post(server, {"messages": [*HELLO, {"role": "assistant", "content": "one two three"}]},
                  "/apply-template").json()["prompt"]
    assert prompt.endswith("<|im_start|>assistant\none two three"), prompt
    m = client.messages.create(model="m", max_tokens=8, messages=prefill, extra_body=GREEDY)
    raw = post(server, {"prompt": prompt, "n_predict": 8, "temperature": 0}, "/completion").json()
    assert m.content[0].text == raw["content"] and m.usage.output_tokens == raw["tokens_predicted"]
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == raw["tokens_evaluated"]
    fresh = client.messages.create(model="m", max_tokens=8, messages=HELLO, extra_body=GREEDY)
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens > \
        fresh.usage.input_tokens + fresh.usage.cache_read_input_tokens
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=2, messages=[*HELLO, {"role": "assistant", "content": "one "}])
    assert "trailing whitespace" in str(e.value)
    # with tool calls the assistant turn is complete: answered with a new turn, as before
    done = [*HELLO, {"role": "assistant", "content": [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "look", "input": {}}]}]
    closed = post(server, {"messages": [*HELLO, {"role": "assistant", "content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "look", "arguments": "{}"}}]}]}, "/apply-template")
    assert closed.json()["prompt"].endswith("<|im_start|>assistant\n"), closed.text
    assert client.messages.create(model="m", max_tokens=2, messages=done, extra_body=GREEDY).stop_reason


def test_max_tokens_beyond_the_context_is_clamped_not_refused(client, server):
    context = agents.served_model(server)[1]
    m = client.messages.create(model="m", max_tokens=32000, messages=HELLO, extra_body=GREEDY)
    assert m.stop_reason in ("end_turn", "model_context_window_exceeded")
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens + m.usage.output_tokens <= context
    # a prompt that leaves 6 tokens: the window, not max_tokens, ends the reply, and says so (the
    # SDK's StopReason "model_context_window_exceeded"); a max_tokens inside the room is max_tokens
    words = "one two three four five six seven eight nine ten " * 60
    prompt = [{"role": "user", "content": "Go on counting: " + words}]
    read = client.messages.count_tokens(model="m", messages=prompt).input_tokens
    cut = max(0, context - 6 - read)
    prompt = [{"role": "user", "content": "Go on counting: " + words[:len(words) - cut * 2]}]
    while (read := client.messages.count_tokens(model="m", messages=prompt).input_tokens) > context - 6:
        prompt[0]["content"] = prompt[0]["content"][:-20]
    for asked, reason in ((32000, "model_context_window_exceeded"), (context - read - 1, "max_tokens")):
        m = client.messages.create(model="m", max_tokens=asked, messages=prompt, extra_body=GREEDY)
        assert m.stop_reason == reason and m.usage.output_tokens == min(asked, context - read), (m, read)


def test_max_tokens_0_warms_the_cache_and_writes_nothing(client, server):
    """Anthropic's pre-warming: max_tokens 0 reads the prompt into the cache and answers no content;
    the same prompt's next request reads it from there. (With Claude Code's session metadata, as
    it would send it: an anonymous slot's cache is the first the idle-cache budget cuts.)"""
    prompt = [{"role": "user", "content": f"{uuid.uuid4().hex}: name three rivers of Europe."}]
    meta = claude_metadata(uuid.uuid4().hex)
    m = client.messages.create(model="m", max_tokens=0, messages=prompt, metadata=meta)
    assert m.content == [] and m.stop_reason == "max_tokens" and m.usage.output_tokens == 0
    read = m.usage.input_tokens + m.usage.cache_read_input_tokens
    events = sse(post(server, {"model": "m", "max_tokens": 0, "messages": prompt, "stream": True, "metadata": meta}))
    assert [e for e, _ in events] == ["message_start", "ping", "message_delta", "message_stop"]
    assert events[2][1]["delta"]["stop_reason"] == "max_tokens" and events[2][1]["usage"]["output_tokens"] == 0
    m = client.messages.create(model="m", max_tokens=4, messages=prompt, extra_body=GREEDY, metadata=meta)
    assert m.usage.cache_read_input_tokens >= read - 1 and m.content, m.usage


def test_message_start_splits_the_prompt_into_input_and_cache_read(server):
    """message_start's usage is Anthropic's: the prompt's tokens the KV cache already held are
    cache_read_input_tokens there, as in the closing message_delta, not only at the end."""
    prompt = [{"role": "user", "content": f"{uuid.uuid4().hex}: name three rivers of Europe."}]
    body = {"model": "m", "max_tokens": 4, "messages": prompt, "stream": True,
            "metadata": claude_metadata(uuid.uuid4().hex), **GREEDY}
    splits = []
    for _ in range(2):
        events = sse(post(server, body))
        assert [n for n, _ in events[:2]] == ["message_start", "ping"] and events[-1][0] == "message_stop"
        start, end = events[0][1]["message"]["usage"], events[-2][1]["usage"]
        split = lambda u: (u["input_tokens"], u["cache_read_input_tokens"])  # noqa: E731
        assert split(start) == split(end), (start, end)
        splits.append(split(start))
    (fresh_input, _), (again_input, again_read) = splits
    assert again_read > 0 and again_input + again_read == fresh_input + splits[0][1], splits


def test_count_tokens_equals_the_prompt_a_request_reads(client):
    body = dict(messages=[{"role": "user", "content": [{"type": "text", "text": "Name a colour."}]}],
                system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}])
    counted = client.messages.count_tokens(model="m", **body)
    MessageTokensCount.model_validate(counted.model_dump())
    m = client.messages.create(model="m", max_tokens=2, extra_body=GREEDY, **body)
    assert counted.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens > 10
    # the system text is in the prompt: a longer one counts more
    longer = [{"type": "text", "text": "You are terse. Answer in one word, never more."}]
    assert client.messages.count_tokens(model="m", messages=body["messages"], system=longer).input_tokens \
        > counted.input_tokens


def test_a_system_message_inside_messages_is_system_text(client):
    """Claude Code sends one after the user turn: it joins the system prompt, and is not refused."""
    messages = [{"role": "user", "content": "Name a colour."}]
    inside = client.messages.count_tokens(model="m", messages=[*messages, {"role": "system", "content": "Be terse."}])
    outside = client.messages.count_tokens(model="m", messages=messages, system="Be terse.")
    assert inside.input_tokens == outside.input_tokens
    m = client.messages.create(model="m", max_tokens=4, extra_body=GREEDY,
                               messages=[*messages, {"role": "system", "content": "Be terse."}])
    assert m.content


def test_server_tools_and_claude_code_fields_are_accepted(client, server):
    tools = [{"name": "get_time", "description": "Current time", "input_schema": {"type": "object"},
              "cache_control": {"type": "ephemeral"}, "defer_loading": True}]
    plain = client.messages.count_tokens(model="m", messages=HELLO, tools=tools).input_tokens
    with_server_tool = client.messages.count_tokens(
        model="m", messages=HELLO, tools=[*tools, {"type": "web_search_20250305", "name": "web_search"}])
    assert with_server_tool.input_tokens == plain  # left out of the prompt
    r = post(server, {"model": "m", "max_tokens": 4, "messages": HELLO, "stream": False, **GREEDY,
                      "thinking": {"type": "adaptive", "display": "omitted"},
                      "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                      "output_config": {"effort": "high"}, "service_tier": "auto",
                      "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "cc-session-1"})}},
             path="/v1/messages?beta=true", headers={"anthropic-version": "2023-06-01", "x-api-key": "any"})
    assert r.status_code == 200, r.text
    Message.model_validate(r.json())


def claude_metadata(session_id: str) -> dict:
    """metadata as Claude Code sends it: user_id is a JSON string holding the session id."""
    return {"user_id": json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": session_id})}


def test_metadata_session_id_keys_the_kv_session(server):
    """metadata.user_id's session_id is the engine session: another conversation saves its state,
    and the next turn of the first reads its prompt from it."""
    a, b = f"claude-{uuid.uuid4()}", f"claude-{uuid.uuid4()}"
    first = post(server, {"model": "m", "max_tokens": 2, "messages": HELLO, "metadata": claude_metadata(a),
                          **GREEDY})
    assert first.status_code == 200, first.text
    other = post(server, {"model": "m", "max_tokens": 2, "metadata": claude_metadata(b), **GREEDY,
                          "messages": [{"role": "user", "content": "Something else entirely, please."}]})
    assert other.status_code == 200, other.text
    listed = requests.get(server.base_url + "/v1/sessions", timeout=10).json()
    assert listed["enabled"], listed
    assert {a, b} <= {s["id"] for s in listed["data"]}
    again = post(server, {"model": "m", "max_tokens": 2, "messages": HELLO, "metadata": claude_metadata(a),
                          **GREEDY}).json()
    prompt = again["usage"]["input_tokens"] + again["usage"]["cache_read_input_tokens"]
    assert again["usage"]["cache_read_input_tokens"] == prompt - 1  # all but the last prompt token


def test_errors_take_anthropics_shape_and_the_sdks_classes(client, server):
    with pytest.raises(anthropic.BadRequestError) as e:  # a malformed image block (a whole one is a placeholder)
        client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "nowhere"}}]}])
    assert e.value.body["error"]["type"] == "invalid_request_error" and "source" in e.value.message
    ErrorResponse.model_validate(e.value.body)
    pasted = client.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    assert pasted.stop_reason in ("end_turn", "max_tokens")  # the thread goes on: the model reads a placeholder
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.post("/v1/messages", body={"model": "m", "messages": HELLO}, cast_to=Message)
    with pytest.raises(anthropic.NotFoundError) as e:
        client.post("/v1/messages/nope", body={}, cast_to=Message)
    ErrorResponse.model_validate(e.value.body)
    for body, status in (([1], 400), ({"max_tokens": 1, "messages": HELLO, "bogus": 1}, 400)):
        r = post(server, body)
        assert r.status_code == status and r.json()["type"] == "error"
        ErrorResponse.model_validate(r.json())
    # the prompt beyond the context: a clear 400 in the words Anthropic's clients look for
    long = [{"role": "user", "content": "word " * 3000}]
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        client.messages.create(model="m", max_tokens=8, messages=long)
    # the OpenAI routes keep their own envelope
    r = post(server, {"messages": "x"}, path="/v1/chat/completions")
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def keyed_server(make_server):
    return make_server({"ETSERVE_API_KEY": "sesame", "ETSERVE_MAX_BODY_BYTES": "20000"})


def test_api_key_by_x_api_key_and_auth_errors(keyed_server):
    ok = anthropic.Anthropic(base_url=keyed_server.base_url, api_key="sesame", max_retries=0)  # sends x-api-key
    assert ok.messages.create(model="m", max_tokens=2, messages=HELLO, extra_body=GREEDY).content
    assert ok.messages.count_tokens(model="m", messages=HELLO).input_tokens > 0
    bad = anthropic.Anthropic(base_url=keyed_server.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model="m", max_tokens=2, messages=HELLO)
    assert e.value.body["error"]["type"] == "authentication_error" and "x-api-key" in e.value.message
    ErrorResponse.model_validate(e.value.body)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.count_tokens(model="m", messages=HELLO)
    big = [{"role": "user", "content": "x" * 30000}]
    with pytest.raises(anthropic.APIStatusError) as e:
        ok.messages.create(model="m", max_tokens=2, messages=big)
    # (the docs name request_too_large, but the SDK's ErrorResponse has no such type: its own wins)
    assert e.value.status_code == 413 and e.value.body["error"]["type"] == "invalid_request_error"
    ErrorResponse.model_validate(e.value.body)


@pytest.fixture(scope="module")
def busy_server(make_server):
    return make_server({"ETSERVE_MAX_QUEUE": "1", "ETSERVE_QUEUE_TIMEOUT": "1", "ETSERVE_PARALLEL": "1"})


def wait_for(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_engine_admission_errors_are_rate_limit_and_overloaded(busy_server):
    """One stream generates; a request waits (queue of 1) and its wait runs out after 1 s: 503
    overloaded_error; a third, while the queue is full: 429 rate_limit_error."""
    srv = busy_server
    client = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0, timeout=120)
    running = requests.post(srv.base_url + "/v1/chat/completions", json={**LONG, "max_tokens": 400, "stream": True},
                            stream=True, timeout=120)
    wait_for(lambda: srv.health()["engine"]["generating"], "the long stream never started")
    results = {}

    def waiter():
        try:
            client.messages.create(model="m", max_tokens=2, messages=HELLO)
        except anthropic.APIStatusError as e:
            results["waiter"] = e

    t = threading.Thread(target=waiter)
    t.start()
    wait_for(lambda: srv.health()["engine"]["waiting"] >= 1, "the waiter never queued")
    with pytest.raises(anthropic.RateLimitError) as e:
        client.messages.create(model="m", max_tokens=2, messages=HELLO)
    assert e.value.body["error"]["type"] == "rate_limit_error" and e.value.response.headers["retry-after"]
    ErrorResponse.model_validate(e.value.body)
    t.join(timeout=60)
    still_generating = srv.health()["engine"]["generating"]
    running.close()
    assert still_generating, "the long stream ended before the waiter's wait ran out"
    waited = results["waiter"]
    assert isinstance(waited, anthropic.ServiceUnavailableError), waited
    assert waited.body["error"]["type"] == "overloaded_error"
    ErrorResponse.model_validate(waited.body)


FAULT_WORD = " giraffe"  # one token in the test model's vocabulary (tests/e2e/test_native_faults.py)


@pytest.fixture(scope="module")
def fault_server(make_server, model_dir):
    from app.text.tokenizer import Tokenizer

    ids = Tokenizer.from_dir(model_dir).encode(FAULT_WORD, add_bos=False)
    assert len(ids) == 1
    return make_server({"ETSERVE_FAULT_INJECT": f"forward_fail_on_token:{ids[0]}"})


def test_a_failure_after_the_stream_started_is_an_error_event(fault_server):
    """The runtime fails while reading the prompt: a stream already sent message_start, so the
    error is Anthropic's `error` event and the stream ends; unstreamed, a 500 api_error."""
    messages = [{"role": "user", "content": f"Tell me about the{FAULT_WORD}."}]
    r = post(fault_server, {"model": "m", "max_tokens": 8, "messages": messages, "stream": True}, stream=True)
    assert r.status_code == 200
    events = sse(r)
    assert [n for n, _ in events] == ["message_start", "ping", "error"]
    ErrorResponse.model_validate(events[-1][1])
    assert events[-1][1]["error"]["type"] == "api_error" and "giraffe" not in json.dumps(events[-1][1])
    client = anthropic.Anthropic(base_url=fault_server.base_url, api_key="x", max_retries=0, timeout=120)
    with pytest.raises(anthropic.APIStatusError) as e:  # the SDK raises the error event as it reads it
        with client.messages.stream(model="m", max_tokens=8, messages=messages) as stream:
            stream.get_final_message()
    assert e.value.body["error"]["type"] == "api_error"
    with pytest.raises(anthropic.InternalServerError) as e:
        client.messages.create(model="m", max_tokens=8, messages=messages)
    ErrorResponse.model_validate(e.value.body)
    ok = client.messages.create(model="m", max_tokens=4, messages=HELLO, extra_body=GREEDY)
    assert ok.content[0].text
