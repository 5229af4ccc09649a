"""/v1/completions `logprobs` (legacy shape) and `n`: checked against the engine driven directly,
through real gunicorn, with the OpenAI SDK and raw HTTP."""

from __future__ import annotations

import json
import math
import time

import openai
import pytest
import requests

from app.engine import GenerationRequest, SamplingParams

PROMPT = "The three primary colors are"
OTHER = "One, two, three, four,"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def direct(served_model, prompt: str, max_tokens: int, k: int):
    """Greedy token events (with k alternatives each) from the engine itself."""
    gen = served_model.engine.generate(GenerationRequest(
        prompt=served_model.tokenizer.encode(prompt), max_tokens=max_tokens,
        sampling=SamplingParams(temperature=0.0), stop_token_ids=served_model.stop_token_ids, top_logprobs=k))
    return [e for e in gen if e.token_id not in served_model.stop_token_ids]


def token_text(served_model, token_id: int) -> str:
    return served_model.tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")


def test_logprobs_are_the_engines_own(client, served_model):
    events = direct(served_model, PROMPT, 6, 3)
    r = client.completions.create(model=served_model.id, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3)
    choice = r.choices[0]
    lp = choice.logprobs
    assert lp.tokens == [token_text(served_model, e.token_id) for e in events]
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == len(events)
    for got, e in zip(lp.token_logprobs, events):
        assert math.isclose(got, e.logprob, rel_tol=1e-5, abs_tol=1e-6)
    for top, e in zip(lp.top_logprobs, events):
        want = {token_text(served_model, t): v for t, v in e.top}
        assert set(top) == set(want) and len(top) == 3  # greedy: the chosen token is the first alternative
        for tok, v in want.items():
            assert math.isclose(top[tok], v, rel_tol=1e-5, abs_tol=1e-6)
    # each offset is where its token's text starts in the choice's text
    assert lp.text_offset[0] == 0
    assert all(choice.text.startswith(tok, off) for tok, off in zip(lp.tokens, lp.text_offset))
    assert "".join(lp.tokens) == choice.text


def test_logprobs_zero_reports_the_chosen_token_only(client, served_model):
    r = client.completions.create(model=served_model.id, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=0)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4
    assert lp.top_logprobs == [{t: v} for t, v in zip(lp.tokens, lp.token_logprobs)]


def test_streamed_logprobs_add_up_to_the_whole(server, served_model):
    body = {"prompt": OTHER, "max_tokens": 8, "temperature": 0, "logprobs": 2}
    whole = requests.post(server.base_url + "/v1/completions", json=body, timeout=120).json()["choices"][0]
    merged = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    text = ""
    with requests.post(server.base_url + "/v1/completions", json={**body, "stream": True}, stream=True,
                       timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                for c in json.loads(line[6:])["choices"]:
                    text += c["text"]
                    if c["text"]:
                        assert c["logprobs"] and c["logprobs"]["tokens"], c
                    for key, values in (c["logprobs"] or {}).items():
                        merged[key] += values
    assert text == whole["text"] and merged == whole["logprobs"]


def test_n_choices_have_their_own_seed_and_share_one_prefill(server, served_model):
    url = server.base_url + "/v1/completions"
    prompt = f"Story {time.time_ns()}: once upon a time, in a land far away,"
    body = {"prompt": prompt, "max_tokens": 5, "temperature": 1.0, "seed": 11}
    r = requests.post(url, json={**body, "n": 3}, timeout=120).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    singles = [requests.post(url, json={**body, "seed": 11 + j}, timeout=120).json()["choices"][0]["text"]
               for j in range(3)]
    assert [c["text"] for c in r["choices"]] == singles
    prompt_tokens = len(served_model.tokenizer.encode(prompt))
    assert r["usage"]["prompt_tokens"] == prompt_tokens  # counted once
    assert r["usage"]["completion_tokens"] == 15
    # prefilled once: the later choices run only the prompt's last token
    assert r["timings"]["prompt_n"] <= prompt_tokens + 2


def test_n_with_a_prompt_list_and_logprobs(client, served_model):
    r = client.completions.create(model=served_model.id, prompt=[PROMPT, OTHER], n=2, max_tokens=3,
                                  temperature=0, logprobs=1)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    one = {p: client.completions.create(model=served_model.id, prompt=p, max_tokens=3, temperature=0, logprobs=1)
           .choices[0] for p in (PROMPT, OTHER)}
    for c, p in zip(r.choices, (PROMPT, PROMPT, OTHER, OTHER)):
        assert c.text == one[p].text and c.logprobs.tokens == one[p].logprobs.tokens
    assert r.usage.prompt_tokens == sum(len(served_model.tokenizer.encode(p)) for p in (PROMPT, OTHER))


def test_streamed_n_choices_equal_the_non_streamed(client, served_model):
    kw = dict(model=served_model.id, prompt=PROMPT, n=2, max_tokens=4, temperature=0.8, seed=3)
    whole = client.completions.create(**kw)
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert texts == {c.index: c.text for c in whole.choices}
    assert finishes == {c.index: c.finish_reason for c in whole.choices}
