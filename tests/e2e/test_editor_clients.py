"""Editor plugins against a real server: llama.vscode's /infill (its warm-up and its completion
request) and Continue's llama.cpp provider on /completion, replayed from tests/clients/corpus
(the bodies as the plugins' own source builds them), plus llama.cpp's semantics they rely on:
n_predict 0 fills the cache, n_cmpl answers an array, t_max_predict_ms ends a choice after a
newline, a FIM prompt too long for the context is trimmed nearest the cursor, not refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from .servers import Server

CORPUS = Path(__file__).resolve().parents[1] / "clients" / "corpus"
LLAMACPP_CASES = sorted(p for p in CORPUS.glob("*.json") if json.loads(p.read_text())["route"] in
                        ("/infill", "/completion", "/completions"))


def post(srv, path, body, **kw):
    return requests.post(srv.base_url + path, json=body, timeout=600, **kw)


def sse(r) -> list[dict]:
    lines = [line for line in r.iter_lines() if line]
    assert b"[DONE]" not in b"".join(lines)  # llama.cpp's stream has none
    return [json.loads(line.removeprefix(b"data: ")) for line in lines if line.startswith(b"data: ")]


def dig(obj, path: str):
    for part in path.split("."):
        assert isinstance(obj, dict) and part in obj, (path, obj)
        obj = obj[part]
    return obj


@pytest.mark.parametrize("case", LLAMACPP_CASES, ids=lambda p: p.stem)
def test_the_plugins_requests_answer_200_with_the_fields_they_read(qwen_server, case):
    spec = json.loads(case.read_text())
    body = spec["body"]
    if spec.get("stream"):
        with post(qwen_server, spec["route"], body, stream=True) as r:
            assert r.status_code == 200, r.text
            assert r.headers["content-type"].startswith("text/event-stream")
            chunks = sse(r)
        assert chunks[-1]["stop"] is True and not any(c["stop"] for c in chunks[:-1])
        text = "".join(c["content"] for c in chunks)
        assert text.strip() and "<|" not in text, text  # the stop strings Continue sends hold
        results = [chunks[-1]]
    else:
        r = post(qwen_server, spec["route"], body)
        assert r.status_code == 200, r.text
        out = r.json()
        n = body.get("n_cmpl", 1)
        results = out if n > 1 else [out]
        assert len(results) == n and [x["index"] for x in results] == list(range(n))
    for result in results:
        for field in spec["reads"]:
            dig(result, field)
        assert isinstance(result["content"], str) and result["stop"] is True
    if body.get("n_predict") == 0:
        assert results[0]["content"] == "" and results[0]["tokens_predicted"] == 0


def test_the_warm_up_request_fills_the_cache_the_next_infill_reuses(qwen_server):
    warm = json.loads((CORPUS / "llama-vscode-infill-warmup.json").read_text())["body"]
    infill = json.loads((CORPUS / "llama-vscode-infill.json").read_text())["body"]
    # a file the server has not seen: nothing of it can be cached before the warm-up
    extra = [{**c, "text": c["text"] + "# warm-up test\n"} for c in warm["input_extra"]]
    w = post(qwen_server, "/infill", {**warm, "input_extra": extra}).json()
    assert w["content"] == "" and w["tokens_predicted"] == 0 and w["stop_type"] == "limit"
    assert w["timings"]["predicted_n"] == 0 and w["tokens_evaluated"] > 40
    r = post(qwen_server, "/infill", {**infill, "input_extra": extra, "n_cmpl": 1, "seed": 7}).json()
    # everything up to the prefix token (the other files and the repository header) was read by the warm-up
    assert r["tokens_cached"] >= w["tokens_evaluated"] - 3, (r["tokens_cached"], w["tokens_evaluated"])
    assert r["timings"]["cache_n"] == r["tokens_cached"]


def test_completion_n_predict_0_then_the_same_prompt_is_cached(qwen_server):
    prompt = "# A list of the planets, one per line, in order from the sun (a test of the prompt cache):\n"
    w = post(qwen_server, "/completion", {"prompt": prompt, "n_predict": 0}).json()
    assert w["content"] == "" and w["tokens_predicted"] == 0
    r = post(qwen_server, "/completion", {"prompt": prompt, "n_predict": 4, "temperature": 0,
                                          "return_tokens": True}).json()
    assert r["tokens_cached"] == w["tokens_evaluated"] - 1  # all but the last prompt token, read again for logits
    assert r["tokens_predicted"] == 4 == len(r["tokens"])
    detok = post(qwen_server, "/detokenize", {"tokens": r["tokens"]}).json()
    assert detok["content"] == r["content"]
    # llama.cpp's cache_prompt false: the same prompt computed again from its first token
    fresh = post(qwen_server, "/completion", {"prompt": prompt, "n_predict": 4, "temperature": 0,
                                              "cache_prompt": False}).json()
    assert fresh["tokens_cached"] == 0 == fresh["timings"]["cache_n"]
    assert fresh["timings"]["prompt_n"] == w["tokens_evaluated"]


def test_completion_prompt_forms_n_cmpl_and_response_fields(qwen_server):
    tok = post(qwen_server, "/tokenize", {"content": "def fib(n):"}).json()["tokens"]
    base = {"n_predict": 6, "temperature": 0}
    text = post(qwen_server, "/completion", {**base, "prompt": "def fib(n):"}).json()
    ids = post(qwen_server, "/completion", {**base, "prompt": tok}).json()
    mixed = post(qwen_server, "/completion", {**base, "prompt": tok[:1] + ["(n):"]}).json()
    assert text["content"] == ids["content"] and text["tokens_evaluated"] == ids["tokens_evaluated"]
    assert mixed["stop"] is True and mixed["tokens_evaluated"] >= 2
    many = post(qwen_server, "/completion", {**base, "prompt": ["def fib(n):", tok], "n_cmpl": 2}).json()
    assert [m["index"] for m in many] == [0, 1, 2, 3] and len({m["content"] for m in many}) == 1  # greedy
    picked = post(qwen_server, "/completions", {**base, "prompt": "def fib(n):",
                                                "response_fields": ["content", "generation_settings/n_predict",
                                                                    "no_such_field"]}).json()
    assert picked == {"content": text["content"], "generation_settings/n_predict": 6}


def test_t_max_predict_ms_ends_the_choice_after_a_newline(qwen_server):
    body = {"prompt": "# Ten numbered lines of text:\n1.", "n_predict": 200, "temperature": 0}
    free = post(qwen_server, "/completion", body).json()
    assert free["tokens_predicted"] > 40 and free["content"].count("\n") >= 3
    cut = post(qwen_server, "/completion", {**body, "t_max_predict_ms": 1}).json()
    assert cut["stop_type"] == "limit" and cut["timings"]["predicted_n"] < 20, cut
    assert "\n" in cut["content"] and free["content"].startswith(cut["content"])


def test_samplers_left_out_are_off(qwen_server):
    body = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0, "seed": 3}
    greedy = post(qwen_server, "/completion", body).json()
    again = post(qwen_server, "/completion", {**body, "samplers": ["top_k", "top_p", "temperature"]}).json()
    assert again["content"] == greedy["content"]
    # without "temperature" in the list, temperature 0 does not make it greedy (llama.cpp's rule)
    settings = post(qwen_server, "/completion", {**body, "samplers": ["top_k"]}).json()["generation_settings"]
    assert settings["temperature"] == 1.0 and settings["top_p"] == 1.0 and settings["min_p"] == 0.0


@pytest.mark.parametrize("route, body, param", [
    ("/completion", {"prompt": "x", "mirostat": 2}, "mirostat"),
    ("/completion", {"prompt": "x", "samplers": ["top_k", "bogus"]}, "samplers"),
    ("/completion", {"prompt": "x", "samplers": "kq"}, "samplers"),
    ("/completion", {"prompt": "x", "lora": [{"id": 0, "scale": 0.5}]}, "lora"),
    ("/completion", {"prompt": [{"multimodal_data": ["AAAA"], "prompt_string": "x"}]}, "prompt[0]"),
    ("/completion", {"prompt": "x", "n_cmpl": 0}, "n_cmpl"),
    ("/completion", {"prompt": "x", "response_fields": "content"}, "response_fields"),
    ("/completion", {"prompt": "x", "n_predict": "5"}, "n_predict"),
    ("/completion", {"prompt": "x", "bogus_knob": 1}, "bogus_knob"),
    ("/completion", {}, "prompt"),
    ("/infill", {"input_prefix": "x", "typical_p": 0.5}, "typical_p"),
    ("/infill", {"input_prefix": "x", "n_probs": 3}, "n_probs"),
])
def test_knobs_that_change_the_answer_are_refused_by_name(qwen_server, route, body, param):
    r = post(qwen_server, route, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.fixture(scope="module")
def small_qwen(qwen_dir):
    srv = Server(qwen_dir, {"ETSERVE_MAX_CONTEXT": "512"})
    try:
        srv.wait_ready(timeout=300)
        yield srv
    finally:
        srv.stop()


def test_a_fim_prompt_too_long_for_the_context_is_trimmed_not_refused(small_qwen):
    far = "".join(f"FAR_AWAY_{i} = {i}\n" for i in range(400))  # ~4k tokens above the function
    prefix = far + "def add(a, b):\n    "
    suffix = "\n\nprint(add(1, 2))\n" + "".join(f"TAIL_{i} = {i}\n" for i in range(400))
    extra = [{"filename": f"f{i}.py", "text": f"# chunk {i}\n" + "x = 1\n" * 40} for i in range(16)]
    for route, body in (("/infill", {"input_prefix": prefix, "input_suffix": suffix, "input_extra": extra,
                                     "n_predict": 16, "temperature": 0}),
                        ("/v1/completions", {"prompt": prefix, "suffix": suffix, "max_tokens": 16, "temperature": 0})):
        r = post(small_qwen, route, body)
        assert r.status_code == 200, r.text
        out = r.json()
        middle = out["content"] if route == "/infill" else out["choices"][0]["text"]
        prompt_tokens = out["tokens_evaluated"] if route == "/infill" else out["usage"]["prompt_tokens"]
        assert prompt_tokens + 16 <= 512
        assert "a + b" in middle, middle  # the lines next to the cursor were kept
        if route == "/infill":
            assert out["truncated"] is True
