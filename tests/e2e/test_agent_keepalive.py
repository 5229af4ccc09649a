"""Agents' idle timers count events, not SSE comments: Codex CLI 0.171 gives up on a Responses
stream that sends only `: keep-alive` comments for its idle timeout ("idle timeout waiting for
SSE"; measured against the real client: comments every second did not keep a 3 s timeout alive,
`response.in_progress` events did). So a Responses stream that waits (for the engine, or while
its long prompt is read) sends `response.in_progress` events, numbered in turn, and a Messages
stream Anthropic's own `ping` events; what follows is unchanged."""

from __future__ import annotations

import json

import openai
import pytest
import requests

from .test_sse_keepalive import INTERVAL, Occupier


@pytest.fixture(scope="module")
def ka_server(make_server):
    # one slot: a request waits behind the Occupier
    return make_server({"ETSERVE_SSE_KEEPALIVE": str(INTERVAL), "ETSERVE_PREFILL_CHUNK": "16", "ETSERVE_PARALLEL": "1"})


def events(srv, path: str, body: dict) -> list[tuple[str, str]]:
    """(SSE event name or '', data or comment) of each event in the stream, in order."""
    out, name = [], ""
    with requests.post(srv.base_url + path, json={**body, "stream": True}, stream=True, timeout=300) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines(chunk_size=None, decode_unicode=True):
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                out.append((name, line[len("data: "):]))
                name = ""
            elif line.startswith(":"):
                out.append(("", line))
    return out


def test_a_waiting_responses_stream_sends_in_progress_events(ka_server):
    body = {"input": "Say hello.", "max_output_tokens": 8, "temperature": 0, "store": False}
    with Occupier(ka_server) as occ:
        occ.release_after(2.5)  # ~8 intervals in line for the engine
        got = events(ka_server, "/v1/responses", body)
    assert not [e for e in got if e[0] == ""], "no bare comments: Codex's idle timer would not count them"
    data = [json.loads(d) for _, d in got]
    first_item = next(i for i, e in enumerate(data) if e["type"] == "response.output_item.added")
    waiting = [e for e in data[:first_item] if e["type"] == "response.in_progress"]
    assert len(waiting) >= 3, [e["type"] for e in data]
    assert [e["sequence_number"] for e in data] == list(range(len(data)))  # numbered in turn, no gaps
    assert data[-1]["type"] in ("response.completed", "response.incomplete")
    assert {e["response"]["id"] for e in waiting} == {data[-1]["response"]["id"]}


def test_the_openai_sdk_reads_the_waiting_stream(ka_server):
    client = openai.OpenAI(base_url=ka_server.base_url + "/v1", api_key="x", max_retries=0, timeout=300)
    with Occupier(ka_server) as occ:
        occ.release_after(2.0)
        with client.responses.stream(model="m", input="Reply with one word: hello.", max_output_tokens=300,
                                     temperature=0, store=False) as stream:
            kinds = [e.type for e in stream]
            final = stream.get_final_response()  # (its accumulator checks the snapshots' identity)
    assert kinds.count("response.in_progress") >= 3 and final.status == "completed"
    assert final.output_text


def test_a_waiting_messages_stream_sends_ping_events(ka_server):
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]}
    with Occupier(ka_server) as occ:
        occ.release_after(2.5)
        got = events(ka_server, "/v1/messages", body)
    assert not [e for e in got if e[0] == ""]
    names = [n for n, _ in got]
    first_block = names.index("content_block_start")
    assert names[:first_block].count("ping") >= 3 and names[-1] == "message_stop", names


def test_the_anthropic_sdk_reads_the_waiting_stream(ka_server):
    """While it waits for the engine the Messages stream's pings come before message_start (which
    waits for the prompt's place in the KV cache, for its usage): the SDK reads them as Anthropic's
    own and builds the message."""
    import anthropic

    client = anthropic.Anthropic(base_url=ka_server.base_url, api_key="x", max_retries=0, timeout=300)
    with Occupier(ka_server) as occ:
        occ.release_after(2.5)
        with client.messages.stream(model="m", max_tokens=8, extra_body={"temperature": 0},
                                    messages=[{"role": "user", "content": "Say hello."}]) as stream:
            kinds = [e.type for e in stream]
            final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert final.content and final.usage.output_tokens > 0
