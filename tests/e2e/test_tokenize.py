"""/tokenize, /detokenize and /apply-template against real gunicorn."""

from __future__ import annotations

import pytest
import requests

TEXT = "Hello world! 你好 🌍"
MESSAGES = [{"role": "user", "content": "Name three colors."}]


def post(server, path: str, body) -> requests.Response:
    return requests.post(server.base_url + path, json=body, timeout=60)


@pytest.mark.parametrize("prefix", ["", "/v1"])
def test_tokenize_llamacpp_shape(server, served_model, prefix):
    r = post(server, prefix + "/tokenize", {"content": TEXT})
    assert r.status_code == 200, r.text
    assert r.json() == {"tokens": served_model.tokenizer.encode(TEXT, add_bos=False)}
    r = post(server, prefix + "/tokenize", {"content": TEXT, "add_special": True})
    assert r.json() == {"tokens": served_model.tokenizer.encode(TEXT)}


def test_tokenize_pieces_and_special_text(server, served_model):
    """llama.cpp's with_pieces (each token's text, or its bytes where they are no whole UTF-8
    character) and parse_special (false: a special token's text is plain text)."""
    r = post(server, "/tokenize", {"content": TEXT, "with_pieces": True})
    assert r.status_code == 200, r.text
    pieces = r.json()["tokens"]
    assert [p["id"] for p in pieces] == served_model.tokenizer.encode(TEXT, add_bos=False)
    data = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert data.decode() == TEXT
    assert any(isinstance(p["piece"], list) for p in pieces)  # the emoji's bytes span tokens
    special = "<|im_end|>"
    (end,) = post(server, "/tokenize", {"content": special}).json()["tokens"]
    assert served_model.tokenizer.is_special(end)
    plain = post(server, "/tokenize", {"content": special, "parse_special": False}).json()["tokens"]
    assert end not in plain and served_model.tokenizer.decode(plain) == special


def test_tokenize_vllm_shape(server, served_model):
    r = post(server, "/tokenize", {"prompt": TEXT})
    assert r.status_code == 200, r.text
    tokens = served_model.tokenizer.encode(TEXT)
    assert r.json() == {"tokens": tokens, "count": len(tokens), "max_model_len": served_model.context_length}


@pytest.mark.parametrize("prefix", ["", "/v1"])
def test_detokenize_round_trips(server, served_model, prefix):
    tokens = post(server, prefix + "/tokenize", {"content": TEXT}).json()["tokens"]
    r = post(server, prefix + "/detokenize", {"tokens": tokens})
    assert r.status_code == 200, r.text
    assert r.json()["content"] == TEXT
    assert post(server, prefix + "/detokenize", {"tokens": []}).json()["content"] == ""


def test_apply_template_renders_what_chat_runs_on(server, served_model):
    r = post(server, "/apply-template", {"messages": MESSAGES})
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert prompt == served_model.template.render(MESSAGES, add_generation_prompt=True)
    assert post(server, "/v1/apply-template", {"messages": MESSAGES}).json()["prompt"] == prompt
    # the chat route runs on exactly these tokens
    tokens = post(server, "/tokenize", {"content": prompt, "add_special": True}).json()["tokens"]
    chat = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1, "temperature": 0}).json()
    assert chat["usage"]["prompt_tokens"] == len(tokens)


@pytest.mark.parametrize("path, body, status, param", [
    ("/tokenize", {}, 400, "content"),
    ("/tokenize", {"content": 5}, 400, "content"),
    ("/tokenize", {"content": "a", "prompt": "b"}, 400, "prompt"),
    ("/tokenize", {"content": "a", "add_special": "yes"}, 400, "add_special"),
    ("/tokenize", {"content": "a", "bogus": 1}, 400, "bogus"),
    ("/detokenize", {}, 400, "tokens"),
    ("/detokenize", {"tokens": [1, "two"]}, 400, "tokens"),
    ("/detokenize", {"tokens": [10**9]}, 400, "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/apply-template", {"messages": []}, 400, "messages"),
    ("/apply-template", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ("/v1/apply-template", {"messages": MESSAGES, "tools": [{"type": "nope"}]}, 400, "tools[0]"),
])
def test_bad_requests(server, path, body, status, param):
    r = post(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"]


def test_only_post(server):
    r = requests.get(server.base_url + "/tokenize", timeout=10)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
