"""Response shapes of the OpenAI routes, whole and streamed, over the scripted model."""

from __future__ import annotations

from .sse import content, events, finish_reasons

HELLO = [{"role": "user", "content": "Hello"}]


def chat(client, **body):
    return client.simulate_post("/v1/chat/completions", json={"messages": HELLO, **body})


def test_chat_completion_shape(fake, client):
    fake.script.reply("Hello", ["Hi", " there", "!"])
    r = chat(client, model="fake-model")
    assert r.status_code == 200, r.text
    body = r.json
    assert body["object"] == "chat.completion" and body["model"] == "fake-model"
    assert body["id"].startswith("chatcmpl-") and isinstance(body["created"], int)
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hi there!"},
                                "logprobs": None, "finish_reason": "stop"}]
    prompt_tokens = len(fake.encode(fake.runtime.prompts[-1]))
    # "Hi", " there" and "!" are a token each; the end-of-turn token is generated and counted too
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 4,
                             "total_tokens": prompt_tokens + 4, "prompt_tokens_details": {"cached_tokens": 0}}
    assert fake.runtime.prompts[-1] == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"


def test_chat_stream_shape(fake, client):
    fake.script.reply("Hello", ["Hi", " there", "!"])
    r = chat(client, stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = events(r.text)
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "fake-model" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:4]] == ["Hi", " there", "!"]
    assert finish_reasons(chunks) == {0: "stop"}
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert content(chunks) == "Hi there!"


def test_stream_without_include_usage_has_no_usage_field(fake, client):
    chunks = events(chat(client, stream=True).text)
    assert all("usage" not in c for c in chunks)
    assert content(chunks) == "OK" and finish_reasons(chunks) == {0: "stop"}


def test_length_finish(fake, client):
    fake.script.reply("Hello", ["Hi", " there", "!"])
    body = chat(client, max_tokens=2).json
    assert body["choices"][0]["message"]["content"] == "Hi there"
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 2
    chunks = events(chat(client, max_tokens=2, stream=True).text)
    assert content(chunks) == "Hi there" and finish_reasons(chunks) == {0: "length"}


def test_n_choices_get_their_own_seeds_and_share_the_prompt(fake, client):
    fake.script.reply("Hello", lambda turn: [f"choice {turn.seed - 100}"])
    body = chat(client, n=3, seed=100).json
    assert [c["message"]["content"] for c in body["choices"]] == ["choice 0", "choice 1", "choice 2"]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    each = len(fake.encode("choice 0")) + 1
    prompt_tokens = len(fake.encode(fake.runtime.prompts[-1]))
    assert body["usage"]["prompt_tokens"] == prompt_tokens  # counted once
    assert body["usage"]["completion_tokens"] == 3 * each
    chunks = events(chat(client, n=3, seed=100, stream=True, stream_options={"include_usage": True}).text)
    assert [content(chunks, i) for i in range(3)] == ["choice 0", "choice 1", "choice 2"]
    assert finish_reasons(chunks) == {0: "stop", 1: "stop", 2: "stop"}
    assert chunks[-1]["usage"]["completion_tokens"] == 3 * each


def test_chat_logprobs_shape(fake, client):
    fake.script.reply("Hello", ["Hi", " there"])
    body = chat(client, logprobs=True, top_logprobs=2).json
    items = body["choices"][0]["logprobs"]["content"]
    assert [i["token"] for i in items] == ["Hi", " there"]  # the end-of-turn token is not content
    assert [i["logprob"] for i in items] == [-0.5, -1.0]
    assert items[0]["bytes"] == list(b"Hi")
    assert [t["token"] for t in items[0]["top_logprobs"]][0] == "Hi" and len(items[0]["top_logprobs"]) == 2


def test_completions_shape_and_echo(fake, client):
    fake.script.reply("Once", [" upon", " a time"])
    r = client.simulate_post("/v1/completions", json={"prompt": "Once", "echo": True})
    assert r.status_code == 200, r.text
    body = r.json
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    assert choice["text"] == "Once upon a time" and choice["finish_reason"] == "stop"
    assert fake.runtime.prompts[-1] == "Once"
    lp = client.simulate_post("/v1/completions", json={"prompt": "Once", "logprobs": 1}).json["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == " upon a time"
    assert lp["text_offset"][0] == 0 and len(lp["top_logprobs"]) == len(lp["tokens"])
    assert lp["token_logprobs"][:2] == [-0.5, -1.0]


def test_completions_stream_and_token_prompts(fake, client):
    fake.script.reply("Once", [" upon"])
    r = client.simulate_post("/v1/completions", json={"prompt": [fake.encode("Once")], "stream": True})
    chunks = events(r.text)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == " upon"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_models_routes(fake, client):
    for prefix in ("/v1", ""):
        listing = client.simulate_get(f"{prefix}/models").json
        assert [m["id"] for m in listing["data"]] == ["fake-model"] and listing["object"] == "list"
        one = client.simulate_get(f"{prefix}/models/fake-model")
        assert one.status_code == 200 and one.json["id"] == "fake-model"
        missing = client.simulate_get(f"{prefix}/models/other")
        assert missing.status_code == 404 and missing.json["error"]["code"] == "model_not_found"


def test_tokenize_round_trip(fake, client):
    ids = client.simulate_post("/tokenize", json={"content": "Hello world"}).json["tokens"]
    assert ids == fake.encode("Hello world")
    text = client.simulate_post("/v1/detokenize", json={"tokens": ids}).json["content"]
    assert text == "Hello world"


def test_sessions_listing_and_delete(fake, client):
    fake.script.reply("Hello", ["Hi"])
    assert chat(client, session_id="s1").status_code == 200
    listing = client.simulate_get("/v1/sessions").json
    assert listing["enabled"] is True and listing["disabled_reason"] is None
    assert [(s["id"], s["live"]) for s in listing["data"]] == [("s1", True)]
    assert client.simulate_delete("/v1/sessions/s1").json == {"id": "s1", "object": "session", "deleted": True}
    assert client.simulate_delete("/v1/sessions/s1").status_code == 404
    assert client.simulate_get("/sessions").json["data"] == []


def test_models_show_the_context_window_where_clients_read_it(fake, client):
    from anthropic.types import ModelInfo
    from openai.types import Model

    listing = client.simulate_get("/v1/models").json
    card = listing["data"][0]
    context = fake.served.context_length
    for field in ("context_length", "max_model_len", "context_window", "max_context_length", "max_input_tokens"):
        assert card[field] == context, field
    assert card["meta"]["n_ctx"] == context
    Model.model_validate(card)  # OpenAI's SDK
    info = ModelInfo.model_validate(card)  # Anthropic's SDK (models.list with anthropic-version)
    assert info.id == "fake-model" and info.type == "model"
    assert listing["has_more"] is False and listing["first_id"] == listing["last_id"] == "fake-model"


def test_messages_thinking_budget_is_validated_in_anthropics_shape(client):
    def post(thinking, max_tokens=4096):
        return client.simulate_post("/v1/messages", json={
            "model": "m", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}],
            "thinking": thinking})

    for thinking, max_tokens, says in (({"type": "enabled", "budget_tokens": -5}, 4096, "greater than or equal"),
                                       ({"type": "enabled", "budget_tokens": 1023}, 4096, "1024"),
                                       ({"type": "enabled", "budget_tokens": 4096}, 4096, "max_tokens"),
                                       ({"type": "enabled"}, 4096, "budget_tokens"),
                                       ({"type": "enabled", "budget_tokens": "2000"}, 4096, "budget_tokens")):
        r = post(thinking, max_tokens)
        assert r.status_code == 400, (thinking, r.text)
        assert r.json["type"] == "error" and r.json["error"]["type"] == "invalid_request_error"
        assert says in r.json["error"]["message"], r.json
    assert post({"type": "enabled", "budget_tokens": 1024}, 2048).status_code == 200
    assert post({"type": "adaptive", "display": "omitted"}).status_code == 200


def test_a_messages_prompt_over_the_context_says_so_in_anthropics_words(fake, client):
    """'prompt is too long: N tokens > M maximum': Claude Code parses the two numbers from
    Anthropic's wording (to size its compaction); any other wording leaves it guessing."""
    import re

    r = client.simulate_post("/v1/messages", json={"model": "m", "max_tokens": 8,
                                                   "messages": [{"role": "user", "content": "x" * 3000}]})
    assert r.status_code == 400 and r.json["error"]["type"] == "invalid_request_error"
    m = re.search(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", r.json["error"]["message"])
    assert m, r.json
    assert int(m.group(1)) > int(m.group(2)) == fake.served.context_length - 1


def test_props_states_the_context_window_where_llama_vscode_reads_it(fake, client):
    props = client.simulate_get("/props").json
    assert props["default_generation_settings"]["n_ctx"] == fake.served.context_length
    # the engine's sequence slots (--parallel, 4 by default), as llama.cpp's --parallel reports them
    assert props["total_slots"] == len(fake.served.engine.slots) == 4
    assert props["modalities"] == {"vision": False, "audio": False}


def test_a_stream_says_it_is_utf_8_so_naive_readers_keep_its_lines_whole(fake, client):
    """requests decodes a text/* body without a charset as Latin-1: the UTF-8 of many letters
    holds byte 0x85, which is then NEL, and str.splitlines (iter_lines) cut JSON lines there
    (seen with Arabic in a tool call's arguments)."""
    import json

    import requests.utils

    fake.script.reply("Hello", ["كأس العالم", " … ", "naïve"])
    r = chat(client, stream=True)
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    encoding = requests.utils.get_encoding_from_headers(r.headers)
    lines = [line for line in r.content.decode(encoding).splitlines() if line.startswith("data: {")]
    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or "" for line in lines)
    assert text == "كأس العالم … naïve"
