"""Fill in the middle for editor plugins, served for real: `suffix` on /v1/completions (OpenAI's
form: Continue, minuet) and llama.cpp's /infill (llama.vscode, llama.vim), both in Qwen2.5-Coder's
own FIM tokens; a model without them (the SmolLM2 test model) refuses with a 400."""

from __future__ import annotations

import ast
import json

import openai
import pytest
import requests

# What an editor sends with the cursor inside a function body: the text before it (ending in the
# body's indentation) and after it. The instruct model writes the right line, then goes on past the
# gap; editors bound the middle with n_indent (llama.vscode sends the cursor line's indentation).
PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"
LOOP_PREFIX = "def total(xs):\n    s = 0\n    for x in xs:\n        "
LOOP_SUFFIX = "\n    return s\n"


def post(srv, path, body, **kw):
    return requests.post(srv.base_url + path, json=body, timeout=300, **kw)


def test_suffix_on_completions_fills_the_middle_so_the_file_parses(qwen_server):
    client = openai.OpenAI(base_url=qwen_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    for prefix, suffix, expected in ((PREFIX, SUFFIX, "a + b"), (LOOP_PREFIX, LOOP_SUFFIX, "x")):
        r = client.completions.create(model="whatever-the-editor-sends", prompt=prefix, suffix=suffix,
                                      max_tokens=24, temperature=0)
        middle = r.choices[0].text
        assert r.model != "whatever-the-editor-sends"
        line = middle.split("\n")[0]
        assert expected in line and "<|" not in middle, middle
        ast.parse(prefix + line + suffix)  # the middle's line completes the code around it
        plain = client.completions.create(model="m", prompt=prefix, max_tokens=24, temperature=0)
        assert plain.choices[0].text != middle  # the suffix is in the prompt: it changes the answer


def test_infill_with_n_indent_ends_the_middle_where_the_block_ends(qwen_server):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 48, "temperature": 0, "n_indent": 4,
            "cache_prompt": True, "samplers": ["top_k", "temperature"], "t_max_predict_ms": 2500}
    whole = post(qwen_server, "/infill", body).json()
    assert whole["stop"] is True and whole["stop_type"] == "limit", whole
    assert whole["content"].startswith("return a + b") and whole["content"].count("\n") <= 2, whole["content"]
    ast.parse(PREFIX + whole["content"] + SUFFIX)

    with post(qwen_server, "/infill", {**body, "stream": True}, stream=True) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert b"[DONE]" not in b"".join(lines)  # llama.cpp's stream has none
    chunks = [json.loads(line.removeprefix(b"data: ")) for line in lines if line.startswith(b"data: ")]
    assert chunks[-1]["stop"] is True and not any(c["stop"] for c in chunks[:-1])
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert chunks[-1]["stop_type"] == "limit"


def test_infill_equals_completions_suffix(qwen_server):
    whole = post(qwen_server, "/infill", {"input_prefix": LOOP_PREFIX, "input_suffix": LOOP_SUFFIX,
                                          "n_predict": 16, "temperature": 0}).json()
    same = post(qwen_server, "/v1/completions", {"prompt": LOOP_PREFIX, "suffix": LOOP_SUFFIX, "max_tokens": 16,
                                                 "temperature": 0}).json()
    assert whole["content"] == same["choices"][0]["text"]
    assert whole["tokens_predicted"] == same["usage"]["completion_tokens"]
    assert whole["tokens_evaluated"] == same["usage"]["prompt_tokens"]


def test_infill_typed_text_and_extra_files_change_the_prompt(qwen_server):
    base = {"input_prefix": "from util import ", "input_suffix": "\n", "n_predict": 8, "temperature": 0}
    plain = post(qwen_server, "/infill", base).json()
    extra = post(qwen_server, "/infill", {**base, "input_extra": [
        {"filename": "util.py", "text": "def frobnicate_widgets(x):\n    return x\n"}]}).json()
    assert extra["tokens_evaluated"] > plain["tokens_evaluated"] + 10  # the other file is in the prompt
    assert "frobnicate_widgets" in extra["content"]  # and the model uses it
    typed = post(qwen_server, "/infill", {**base, "prompt": "frob"}).json()
    assert typed["tokens_evaluated"] > plain["tokens_evaluated"]


def test_n_predict_limits_and_stop_words_end_the_middle(qwen_server):
    r = post(qwen_server, "/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 2,
                                      "temperature": 0}).json()
    assert r["tokens_predicted"] == 2 and r["stop_type"] == "limit"
    r = post(qwen_server, "/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 48,
                                      "temperature": 0, "stop": ["+"]}).json()
    assert r["stop_type"] == "word" and r["stopping_word"] == "+" and r["content"] == "return a "


@pytest.mark.parametrize("body, param", [
    ({"input_prefix": 5}, "input_prefix"),
    ({"input_prefix": "x", "input_extra": [{"text": 3}]}, "input_extra[0]"),
    ({"input_prefix": "x", "input_extra": "nope"}, "input_extra"),
    ({"input_prefix": "x", "bogus_knob": 1}, "bogus_knob"),
    ({"input_prefix": "x", "n_predict": 4, "max_tokens": 4}, "n_predict"),
    ({"input_prefix": "x", "temperature": 9}, "temperature"),
    ({"input_prefix": "x", "ignore_eos": "yes"}, "ignore_eos"),
    ({"input_prefix": "x", "n_indent": -1}, "n_indent"),
])
def test_bad_infill_requests_are_refused_by_name(qwen_server, body, param):
    r = post(qwen_server, "/infill", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_echo_with_suffix_is_refused(qwen_server):
    r = post(qwen_server, "/v1/completions", {"prompt": "a", "suffix": "b", "echo": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"


def test_a_model_without_fim_tokens_refuses_fill_in_the_middle(server):
    for path, body in (("/v1/completions", {"prompt": "def f():", "suffix": "\n"}),
                       ("/infill", {"input_prefix": "def f():", "input_suffix": "\n"})):
        r = post(server, path, body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "fim_not_supported" and "fill-in-the-middle" in err["message"]
