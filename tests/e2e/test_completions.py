"""Legacy text completions (/v1/completions): a real OpenAI client against real gunicorn."""

from __future__ import annotations

import json

import openai
import pytest
import requests

from app.engine import GenerationRequest, SamplingParams

PROMPT = "The three primary colors are"
OTHER = "One, two, three, four,"


def direct_greedy(served_model, prompt: str | list[int], max_tokens: int) -> tuple[str, str, int]:
    """Greedy text, finish reason and prompt length from the engine driven directly, no HTTP in between."""
    ids = served_model.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    gen = served_model.engine.generate(GenerationRequest(
        prompt=ids, max_tokens=max_tokens, sampling=SamplingParams(temperature=0.0),
        stop_token_ids=served_model.stop_token_ids))
    out = [e.token_id for e in gen]
    return served_model.tokenizer.decode(out, skip_special_tokens=True), gen.stats.finish_reason, len(ids)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def expected(served_model):
    return {n: direct_greedy(served_model, PROMPT, n) for n in (4, 16)}


def test_default_max_tokens_is_16_and_matches_engine(client, served_model, expected):
    text, finish, prompt_tokens = expected[16]
    assert text.strip(), "the model produced no text"
    r = client.completions.create(model=served_model.id, prompt=PROMPT, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == served_model.id
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.index == 0 and choice.text == text and choice.finish_reason == finish
    assert choice.logprobs is None
    assert r.usage.prompt_tokens == prompt_tokens
    assert r.usage.completion_tokens <= 16 and (finish == "stop" or r.usage.completion_tokens == 16)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_matches_engine(client, served_model, expected):
    text, finish, prompt_tokens = expected[4]
    chunks = list(client.completions.create(model=served_model.id, prompt=PROMPT, max_tokens=4, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1 and all(c.object == "text_completion" for c in chunks)
    with_choices = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in with_choices) == text
    assert with_choices[-1].choices[0].finish_reason == finish
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage.prompt_tokens == prompt_tokens
    assert last.usage.completion_tokens == 4 or finish == "stop"


def test_echo_prepends_the_prompt(client, served_model, expected):
    text, _, _ = expected[4]
    r = client.completions.create(model=served_model.id, prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
    assert r.choices[0].text == PROMPT + text
    chunks = list(client.completions.create(model=served_model.id, prompt=PROMPT, max_tokens=4, temperature=0,
                                            echo=True, stream=True))
    assert chunks[0].choices[0].text == PROMPT
    assert "".join(c.choices[0].text for c in chunks if c.choices) == PROMPT + text


def test_list_prompt_gives_one_choice_per_prompt_in_order(client, served_model, expected):
    other, other_finish, other_tokens = direct_greedy(served_model, OTHER, 4)
    text, finish, prompt_tokens = expected[4]
    r = client.completions.create(model=served_model.id, prompt=[PROMPT, OTHER], max_tokens=4, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert [c.text for c in r.choices] == [text, other]
    assert [c.finish_reason for c in r.choices] == [finish, other_finish]
    assert r.usage.prompt_tokens == prompt_tokens + other_tokens
    # streamed: every chunk names its choice; each choice's text comes out whole and in order
    chunks = list(client.completions.create(model=served_model.id, prompt=[PROMPT, OTHER], max_tokens=4,
                                            temperature=0, stream=True))
    texts = {0: "", 1: ""}
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.text
    assert texts == {0: text, 1: other}
    order = [choice.index for c in chunks for choice in c.choices]
    assert order == sorted(order)


def test_token_id_prompts_equal_string_prompts(client, served_model, expected):
    text, _, _ = expected[4]
    ids = served_model.tokenizer.encode(PROMPT)
    r = client.completions.create(model=served_model.id, prompt=ids, max_tokens=4, temperature=0, echo=True)
    assert r.choices[0].text == served_model.tokenizer.decode(ids) + text
    other_ids = served_model.tokenizer.encode(OTHER)
    other, _, _ = direct_greedy(served_model, OTHER, 4)
    r = client.completions.create(model=served_model.id, prompt=[ids, other_ids], max_tokens=4, temperature=0)
    assert [c.text for c in r.choices] == [text, other]


def test_stop_string_cuts(client, served_model, expected):
    text, _, _ = expected[16]
    words = text.split()
    if len(words) < 3:
        pytest.skip(f"greedy text too short to pick a stop from: {text!r}")
    stop = words[2]
    cut = text[: text.index(stop)]
    r = client.completions.create(model=served_model.id, prompt=PROMPT, temperature=0, stop=[stop])
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"


def test_without_v1_prefix(server, served_model):
    """/completions without /v1 is llama.cpp's own route (its /completion), as in llama.cpp;
    /v1/completions is OpenAI's."""
    r = requests.post(server.base_url + "/completions", timeout=60,
                      json={"prompt": PROMPT, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 1 and r.json()["stop"] is True
    r = requests.post(server.base_url + "/v1/completions", timeout=60,
                      json={"prompt": PROMPT, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1


def test_stream_wire_format(server):
    r = requests.post(server.base_url + "/v1/completions", stream=True, timeout=120,
                      json={"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line for line in r.iter_lines() if line and not line.startswith(b":")]  # ":" lines: SSE comments
    assert events[-1] == b"data: [DONE]"
    for line in events[:-1]:
        assert line.startswith(b"data: ")
        payload = json.loads(line[6:])
        assert payload["object"] == "text_completion" and "usage" not in payload
        for choice in payload["choices"]:
            assert isinstance(choice["text"], str) and choice["logprobs"] is None


@pytest.mark.parametrize("body, status, param", [
    ({"prompt": PROMPT, "suffix": "done"}, 400, "suffix"),
    ({"prompt": PROMPT, "logprobs": 6}, 400, "logprobs"),
    ({"prompt": PROMPT, "logprobs": -1}, 400, "logprobs"),
    ({"prompt": PROMPT, "logprobs": True}, 400, "logprobs"),
    ({"prompt": PROMPT, "echo": True, "logprobs": 0}, 400, "echo"),
    ({"prompt": PROMPT, "best_of": 3}, 400, "best_of"),
    ({"prompt": PROMPT, "n": 9}, 400, "n"),
    ({"prompt": PROMPT, "n": 0}, 400, "n"),
    ({"prompt": [1, 2, 10**9]}, 400, "prompt"),
    ({"prompt": [[1, 2], [-1]]}, 400, "prompt[1]"),
    ({"prompt": [[1, 2], "mixed"]}, 400, "prompt"),
    ({"prompt": ["x"] * 9}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({}, 400, "prompt"),
    ({"prompt": PROMPT, "temperature": 3}, 400, "temperature"),
    ({"prompt": PROMPT, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"prompt": PROMPT, "bogus": 1}, 400, "bogus"),
])
def test_bad_requests(server, body, status, param):
    r = requests.post(server.base_url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"]


@pytest.mark.parametrize("body", [
    {"prompt": "word " * 600, "stream": True},
    {"prompt": "word " * 600, "max_tokens": 5},
])
def test_prompt_over_the_context_is_refused_before_streaming(server, body):
    r = requests.post(server.base_url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_any_model_name_is_served_under_the_servers_own_id(client, server):
    served = requests.get(server.base_url + "/v1/models", timeout=10).json()["data"][0]["id"]
    for name in ("no-such-model", "executorch", "gpt-4o"):  # names clients hard-code
        r = client.completions.create(model=name, prompt=PROMPT, max_tokens=1)
        assert r.model == served != name


def test_strict_model_name_refuses_other_names(make_server):
    strict = make_server({"ETSERVE_STRICT_MODEL_NAME": "1"})
    served = requests.get(strict.base_url + "/v1/models", timeout=10).json()["data"][0]["id"]
    for path, body in (("/v1/completions", {"prompt": PROMPT, "max_tokens": 1}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
                       ("/tokenize", {"content": "a"})):
        r = requests.post(strict.base_url + path, json={**body, "model": "no-such-model"}, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["param"] == "model", r.text
        assert requests.post(strict.base_url + path, json={**body, "model": served}, timeout=30).status_code == 200
