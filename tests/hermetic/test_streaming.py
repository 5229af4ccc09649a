"""Streaming and stop-string edge cases, over HTTP, streamed and whole (they must agree)."""

from __future__ import annotations

import json
import socket

import pytest

from .background import Background, call_with_socket, wait_for
from .sse import content, events, finish_reasons

HELLO = [{"role": "user", "content": "Hello"}]


def chat(client, **body):
    return client.simulate_post("/v1/chat/completions", json={"messages": HELLO, **body})


def both(client, **body) -> tuple[dict, list[dict]]:
    whole = chat(client, **body)
    assert whole.status_code == 200, whole.text
    streamed = chat(client, stream=True, stream_options={"include_usage": True}, **body)
    assert streamed.status_code == 200, streamed.text
    return whole.json, events(streamed.text)


def test_stop_string_cut_across_tokens(fake, client):
    # "EN" + "D" : the stop "END" spans two tokens; nothing of it may leak into the stream
    fake.script.reply("Hello", ["Hi", " there", " E", "N", "D", " more"])
    whole, chunks = both(client, stop=["ND "])
    assert whole["choices"][0]["message"]["content"] == "Hi there E"
    whole, chunks = both(client, stop=["END"])
    assert whole["choices"][0]["message"]["content"] == "Hi there "
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert content(chunks) == "Hi there " and finish_reasons(chunks) == {0: "stop"}
    assert not any("E" in (c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])
    # generation ended at the token that completed the stop: " E", "N", "D" were generated, " more" not
    assert whole["usage"]["completion_tokens"] == sum(len(fake.encode(p)) for p in ["Hi", " there", " E", "N", "D"])
    assert chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_the_earliest_of_several_stops_wins(fake, client):
    fake.script.reply("Hello", ["aaXbbYcc"])
    whole, chunks = both(client, stop=["Y", "bX", "X"])
    assert whole["choices"][0]["message"]["content"] == "aa" and content(chunks) == "aa"


def test_multibyte_stop_strings(fake, client):
    # every UTF-8 byte is its own token here: "é" and "🙂" span 2 and 4 tokens
    fake.script.reply("Hello", ["Caf", "é", " au lait 🙂 fin"])
    whole, chunks = both(client, stop=["🙂"])
    assert whole["choices"][0]["message"]["content"] == "Café au lait "
    assert content(chunks) == "Café au lait "
    assert all("\ufffd" not in (c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])
    whole, chunks = both(client, stop=["é au"])
    assert whole["choices"][0]["message"]["content"] == "Caf" and content(chunks) == "Caf"
    # a stop that shares only its first bytes with the text never matches
    whole, _ = both(client, stop=["è"])  # U+00E8 and U+00E9 share their first UTF-8 byte
    assert whole["choices"][0]["message"]["content"] == "Café au lait 🙂 fin"
    assert whole["choices"][0]["finish_reason"] == "stop"


def test_stop_with_logprobs_covers_the_tokens_sent(fake, client):
    fake.script.reply("Hello", ["Hi", " there", " E", "N", "D", " more"])
    whole, chunks = both(client, stop=["END"], logprobs=True, top_logprobs=1)
    choice = whole["choices"][0]
    tokens = [t["token"] for t in choice["logprobs"]["content"]]
    assert choice["message"]["content"] == "Hi there " == content(chunks)
    # every token of the content, and nothing generated after the stop (at most the stop's own tokens)
    assert "".join(tokens) in ("Hi there ", "Hi there END")
    assert "".join(streamed_logprob_tokens(chunks)) in ("Hi there ", "Hi there END")


def streamed_logprob_tokens(chunks) -> list[str]:
    return [t["token"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
            for t in c["choices"][0]["logprobs"]["content"]]


def test_stop_logprobs_are_the_same_streamed_and_whole(fake, client):
    fake.script.reply("Hello", ["Hi", " there", " E", "N", "D", " more"])
    whole, chunks = both(client, stop=["END"], logprobs=True, top_logprobs=1)
    assert [t["token"] for t in whole["choices"][0]["logprobs"]["content"]] == streamed_logprob_tokens(chunks)


def test_stop_with_n_choices(fake, client):
    fake.script.reply("Hello", lambda turn: ["one STOP two"] if turn.seed == 7 else ["uno dos"])
    whole, chunks = both(client, n=2, seed=7, stop=["STOP"])
    assert [c["message"]["content"] for c in whole["choices"]] == ["one ", "uno dos"]
    assert [c["finish_reason"] for c in whole["choices"]] == ["stop", "stop"]
    assert [content(chunks, 0), content(chunks, 1)] == ["one ", "uno dos"]
    assert finish_reasons(chunks) == {0: "stop", 1: "stop"}
    # usage: "one ", "STOP" (one token) for choice 0; "uno dos" and the end-of-turn token for choice 1
    expected = len(fake.encode("one ")) + 1 + len(fake.encode("uno dos")) + 1
    assert whole["usage"]["completion_tokens"] == expected == chunks[-1]["usage"]["completion_tokens"]


def test_completions_stop_and_usage(fake, client):
    fake.script.reply("Count", [" 1, 2, 3, 4"], then="repeat")
    r = client.simulate_post("/v1/completions", json={"prompt": "Count", "stop": [", 3"], "max_tokens": 50})
    choice = r.json["choices"][0]
    assert choice["text"] == " 1, 2" and choice["finish_reason"] == "stop"
    assert r.json["usage"]["completion_tokens"] == len(fake.encode(" 1, 2, 3"))


def test_tool_call_streaming(fake, client):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    fake.script.reply("weather", ["Let me check.", "<tool_call>", '\n{"', "name", '": "get_weather", "',
                                  "arguments", '": {"city": "Par', 'is"}}\n', "</tool_call>"])
    body = {"messages": [{"role": "user", "content": "weather in Paris?"}], "tools": tools}
    whole = client.simulate_post("/v1/chat/completions", json=body).json
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check."
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert "<tools>" in fake.runtime.prompts[-1]  # the template got the tools

    chunks = events(client.simulate_post("/v1/chat/completions", json={**body, "stream": True}).text)
    assert content(chunks) == "Let me check."
    calls = [c["choices"][0]["delta"]["tool_calls"] for c in chunks
             if c["choices"] and c["choices"][0]["delta"].get("tool_calls")]
    assert calls[0][0]["function"]["name"] == "get_weather" and calls[0][0]["id"] and calls[0][0]["index"] == 0
    arguments = "".join(d[0]["function"]["arguments"] for d in calls)
    assert json.loads(arguments) == {"city": "Paris"}
    assert len(calls) >= 2  # a start (name, id, arguments "") and then the arguments
    assert finish_reasons(chunks) == {0: "tool_calls"}
    assert not any("<tool_call>" in (c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])


def test_json_cut_off_by_max_tokens_under_response_format(fake, client):
    reply = '{"answer": "a long answer that goes on"}'
    fake.script.reply("Hello", [reply])
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}}
    whole, chunks = both(client, max_tokens=8, **body)
    text = whole["choices"][0]["message"]["content"]
    assert text == fake.tokenizer.decode(fake.encode(reply)[:8]) and whole["choices"][0]["finish_reason"] == "length"
    assert content(chunks) == text and finish_reasons(chunks) == {0: "length"}
    with pytest.raises(ValueError):
        json.loads(text)  # cut off: the client learns it from finish_reason "length"
    assert fake.runtime.masked == 0  # the scripted JSON was inside the grammar all along
    whole, _ = both(client, max_tokens=200, **body)
    assert json.loads(whole["choices"][0]["message"]["content"]) == {"answer": "a long answer that goes on"}
    assert whole["choices"][0]["finish_reason"] == "stop"


def test_response_format_keeps_output_in_the_grammar(fake, client):
    fake.script.reply("Hello", ["not json at all"])
    whole = chat(client, max_tokens=5, response_format={"type": "json_object"}).json
    assert fake.runtime.masked > 0  # the grammar overrode the script
    assert whole["choices"][0]["message"]["content"].lstrip()[:1] in ("{", "")


def test_a_client_leaving_mid_stream_stops_generation(fake, client):
    fake.script.reply("Hello", ["Hi"], then="repeat")  # would run to max_tokens
    server_end, client_end = socket.socketpair()
    fake.runtime.hold()
    stream = Background(lambda: call_with_socket(client.app, "/v1/chat/completions",
                                                 {"messages": HELLO, "stream": True, "max_tokens": 200}, server_end))
    wait_for(lambda: fake.engine.generating)
    client_end.close()
    fake.runtime.release()
    status, body = stream.result()
    server_end.close()
    assert status.startswith("200")
    assert fake.runtime.forward_calls < 10  # stopped within a token or so, not after 200
    assert not fake.engine.generating
    # the engine is free for the next request
    assert chat(client, max_tokens=2).json["choices"][0]["message"]["content"] == "HiHi"


def test_a_whole_response_whose_client_left_is_cancelled(fake, client):
    fake.script.reply("Hello", ["Hi"], then="repeat")
    server_end, client_end = socket.socketpair()
    fake.runtime.hold()
    request = Background(lambda: call_with_socket(client.app, "/v1/chat/completions",
                                                  {"messages": HELLO, "max_tokens": 200}, server_end))
    wait_for(lambda: fake.engine.generating)
    client_end.close()
    fake.runtime.release()
    request.result()
    server_end.close()
    assert fake.runtime.forward_calls < 10


def test_unicode_line_separators_stay_inside_their_data_line(fake, client):
    # U+2028, U+2029 and NEL are legal raw in JSON, but str.splitlines() (requests'
    # iter_lines(decode_unicode=True)) and some JavaScript readers end a line at them: a stream
    # carrying them raw reached a client as a data line cut in two
    text = "a\u2028b\u2029c\x85d é"
    fake.script.reply("Hello", ["a\u2028b", "\u2029c", "\x85d", " é"])
    streamed = chat(client, stream=True)
    assert streamed.status_code == 200
    lines = [ln for ln in streamed.text.splitlines() if ln]  # str.splitlines, as those readers split
    assert all(ln.startswith("data: ") for ln in lines), lines
    chunks = [json.loads(ln[6:]) for ln in lines if ln != "data: [DONE]"]
    assert content(chunks) == text
    assert "é" in streamed.text  # other non-ASCII text still goes as UTF-8, unescaped
