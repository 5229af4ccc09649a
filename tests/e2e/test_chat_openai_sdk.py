"""A real OpenAI client against real gunicorn with a real model: the walking skeleton."""

from __future__ import annotations

import json

import openai
import pytest
import requests

from app.engine import GenerationRequest, SamplingParams

PROMPT = [{"role": "user", "content": "Name three colors of the rainbow."}]
MAX_TOKENS = 24


def direct_greedy_text(served_model, messages, max_tokens: int) -> tuple[str, str]:
    """Greedy text and finish reason from the engine driven directly, no HTTP in between."""
    prompt = served_model.template.render(messages, add_generation_prompt=True)
    ids = served_model.tokenizer.encode(prompt)
    gen = served_model.engine.generate(GenerationRequest(
        prompt=ids, max_tokens=max_tokens, sampling=SamplingParams(temperature=0.0),
        stop_token_ids=served_model.stop_token_ids))
    out = [e.token_id for e in gen]
    return served_model.tokenizer.decode(out, skip_special_tokens=True), gen.stats.finish_reason


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_lists_the_served_model(client, served_model):
    ids = [m.id for m in client.models.list().data]
    assert ids == [served_model.id]


def test_non_streaming_matches_engine_and_repeats(client, served_model):
    expected, finish = direct_greedy_text(served_model, PROMPT, MAX_TOKENS)
    assert expected.strip(), "the model produced no text"
    texts = []
    for _ in range(2):
        r = client.chat.completions.create(model=served_model.id, messages=PROMPT,
                                           max_tokens=MAX_TOKENS, temperature=0)
        assert r.object == "chat.completion"
        choice = r.choices[0]
        assert choice.message.role == "assistant"
        assert choice.finish_reason == finish
        assert r.usage.completion_tokens <= MAX_TOKENS
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        texts.append(choice.message.content)
    assert texts == [expected, expected]


def test_streaming_matches_engine_and_repeats(client, served_model):
    expected, finish = direct_greedy_text(served_model, PROMPT, MAX_TOKENS)
    for _ in range(2):
        stream = client.chat.completions.create(model=served_model.id, messages=PROMPT, max_tokens=MAX_TOKENS,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True})
        chunks = list(stream)
        assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
        with_choices = [c for c in chunks if c.choices]
        assert with_choices[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in with_choices)
        assert text == expected
        assert with_choices[-1].choices[0].finish_reason == finish
        assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
        usage = chunks[-1].usage
        assert chunks[-1].choices == [] and usage.completion_tokens >= 1


def test_stream_wire_format(server, served_model):
    """Raw SSE: every event is `data: <json>`, content is never null, it ends with [DONE]."""
    r = requests.post(server.base_url + "/v1/chat/completions", stream=True, timeout=120,
                      json={"messages": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [line for line in r.iter_lines() if line and not line.startswith(b":")]  # ":" lines: SSE comments
    assert events[-1] == b"data: [DONE]"
    for line in events[:-1]:
        assert line.startswith(b"data: ")
        payload = json.loads(line[6:])
        assert "error" not in payload
        for choice in payload["choices"]:
            assert choice["delta"].get("content", "") is not None


@pytest.mark.parametrize("content", ["Reply with exactly: 你好世界 🌍 café", "Repeat after me: 你好世界 🌍 café"])
def test_multibyte_characters_arrive_whole(server, served_model, content):
    """Every SSE event is valid UTF-8 on its own and no character is split, whatever the tokens split.

    The one U+FFFD allowed is a character cut in half by max_tokens at the very end,
    exactly as the tokenizer's own decode renders it.
    """
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 40, "temperature": 0, "stream": True}
    r = requests.post(server.base_url + "/v1/chat/completions", json=body, stream=True, timeout=120)
    assert r.status_code == 200
    pieces, finish = [], None
    for line in r.iter_lines():
        if not line or line == b"data: [DONE]":
            continue
        payload = json.loads(line[6:].decode("utf-8", errors="strict"))
        assert "error" not in payload
        for choice in payload["choices"]:
            pieces.append(choice["delta"].get("content") or "")
            finish = choice["finish_reason"] or finish
    text = "".join(pieces)
    expected, _ = direct_greedy_text(served_model, body["messages"], 40)
    assert text == expected
    body_text = text[:-1] if finish == "length" and text.endswith("\ufffd") else text
    assert "\ufffd" not in body_text
    assert "🌍" in text, f"expected the model to repeat the emoji, got {text!r}"


def test_timings_and_cached_tokens(server):
    """A repeated prompt reuses the KV cache: the second request prefills only what changed."""
    body = {"messages": [{"role": "user", "content": "Tell me about owls."}], "max_tokens": 4, "temperature": 0}
    first = requests.post(server.base_url + "/v1/chat/completions", json=body, timeout=120).json()
    second = requests.post(server.base_url + "/v1/chat/completions", json=body, timeout=120).json()
    assert second["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == second["usage"]["prompt_tokens"] - 1  # all but the last prompt token
    t = second["timings"]
    assert t["cache_n"] == cached and t["prompt_n"] == 1
    assert t["predicted_n"] == second["usage"]["completion_tokens"] and t["predicted_ms"] > 0
    # llama.cpp's per-token figures beside its per-second ones
    assert t["prompt_per_token_ms"] == round(t["prompt_ms"] / t["prompt_n"], 3)
    assert abs(t["predicted_per_token_ms"] * t["predicted_per_second"] - 1000) < 5


# What llama.cpp's web UI sends to /v1/chat/completions with its default settings (and Open
# WebUI's and SillyTavern's llama.cpp presets similar): its sampler fields, "no limit" as -1.
LLAMA_WEBUI = {"stream": True, "return_progress": True, "reasoning_format": "auto", "temperature": 0.8,
               "max_tokens": -1, "dynatemp_range": 0, "dynatemp_exponent": 1, "top_k": 40, "top_p": 0.95,
               "min_p": 0.05, "xtc_probability": 0, "xtc_threshold": 0.1, "typ_p": 1, "repeat_last_n": 64,
               "repeat_penalty": 1, "presence_penalty": 0, "frequency_penalty": 0, "dry_multiplier": 0,
               "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1,
               "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
               "backend_sampling": False, "timings_per_token": True, "cache_prompt": True}


def chat(server, **body):
    return requests.post(server.base_url + "/v1/chat/completions", timeout=120,
                         json={"messages": [{"role": "user", "content": "Tell me about owls."}], **body})


def test_llama_cpp_web_uis_request_is_served(server):
    r = chat(server, **{**LLAMA_WEBUI, "seed": 3})
    assert r.status_code == 200, r.text
    events = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) > 3
    # max_tokens -1: until an end token or the context's end (no 400), the stream ends with a reason
    assert any('"finish_reason": "' in e for e in events)


def test_llama_cpp_sampling_fields_are_honoured_on_chat(server):
    greedy = chat(server, max_tokens=6, temperature=0).json()
    # only the temperature sampler: with temperature 0, the same greedy text
    only_temp = chat(server, max_tokens=6, temperature=0, samplers=["temperature"], repeat_penalty=1.0).json()
    assert only_temp["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"]
    # cache_prompt false: the prompt computed again, nothing reused (the documented way to runs that
    # do not depend on what the slots hold)
    fresh = chat(server, max_tokens=6, temperature=0, cache_prompt=False).json()
    assert fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 == fresh["timings"]["cache_n"]
    again = chat(server, max_tokens=6, temperature=0).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    for field, value in (("typical_p", 0.5), ("typ_p", 0.9), ("mirostat", 2), ("ignore_eos", "yes")):
        r = chat(server, max_tokens=2, **{field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    r = chat(server, max_tokens=2, reasoning_format="bogus")
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_format"
    r = chat(server, max_tokens=2, repeat_penalty=1.1, repetition_penalty=1.1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "repeat_penalty"


def test_ignore_eos_runs_to_max_tokens(server):
    """llama.cpp's and vLLM's ignore_eos (benchmark clients send it for outputs of a set length): the
    end tokens are banned and stop nothing."""
    ask = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 60, "temperature": 0}
    plain = requests.post(server.base_url + "/v1/chat/completions", json=ask, timeout=120).json()
    assert plain["choices"][0]["finish_reason"] == "stop" and plain["usage"]["completion_tokens"] < 60
    long = requests.post(server.base_url + "/v1/chat/completions", json={**ask, "ignore_eos": True}, timeout=120).json()
    assert long["choices"][0]["finish_reason"] == "length" and long["usage"]["completion_tokens"] == 60
    r = requests.post(server.base_url + "/completion", timeout=120, json={
        "prompt": "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n", "n_predict": 60,
        "temperature": 0, "ignore_eos": True}).json()
    assert r["tokens_predicted"] == 60 and r["stop_type"] == "limit"
