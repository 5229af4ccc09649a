"""Chat template features and the reference-server command line, against real servers and the real model:

- `etserve` flags (--model-path to a bare .pte, --hf-tokenizer, --max-context, --no-think, --model-id);
- reasoning split out into `reasoning_content` / `delta.reasoning_content` for a template whose
  generation prompt opens <think> (the small model is few-shot prompted to close it), then tool
  calls parsed from what follows the reasoning;
- a template's raise_exception as a 400 carrying its message;
- --tokenizer-path with a tokenizer that has no chat template: refused, or ChatML with
  --allow-chatml-fallback;
- start-up errors: --max-context beyond the .pte's max_seq_len, a --hf-tokenizer without a config.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from app.settings import SETTINGS, Settings
from app.text.reasoning import split_reasoning

from .servers import ROOT, Server, free_port


ETSERVE = Path(sys.executable).parent / "etserve"

# Generation prompt opens <think> (DeepSeek-R1 / Qwen3 style); enable_thinking=false writes an
# empty block instead (Qwen3 style). Refuses conversations that start with an assistant turn.
REASONING_TEMPLATE = (
    "{% if messages[0]['role'] == 'assistant' %}"
    "{{ raise_exception('Conversations must not start with an assistant message') }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}"
)
THINK = {"enable_thinking": True}


def few_shot(question: str) -> list[dict]:
    """Three worked turns that reason, close </think>, then answer: the small model copies the pattern."""
    messages = [{"role": "system", "content": "Think inside <think></think>, then answer."}]
    for q, r, a in [("What is 2+3?", "2 plus 3 makes 5.", "5"), ("What is 4+4?", "4 plus 4 makes 8.", "8"),
                    ("What is 1+6?", "1 plus 6 makes 7.", "7")]:
        messages += [{"role": "user", "content": q},
                     {"role": "assistant", "content": f"<think>\n{r}\n</think>\n\n{a}"}]
    return messages + [{"role": "user", "content": question}]


class CliServer(Server):
    """The `etserve` console script with flags only (no ETSERVE_* setting in its environment)."""

    def __init__(self, *flags: str):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k not in {s.env for s in SETTINGS}}
        self.log_path = ROOT / "test-artifacts" / f"server-{self.port}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(ETSERVE), *flags, "--host", "127.0.0.1", "--port", str(self.port), "--threads", "2"],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)


def _tokenizer_dir(tmp: Path, model_dir: Path, template: str | None) -> Path:
    """A tokenizer directory like a Hugging Face one: the model's tokenizer files, another template."""
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copy(model_dir / "tokenizer.json", tmp / "tokenizer.json")
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    if template is not None:
        config["chat_template"] = template
    (tmp / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp


@pytest.fixture(scope="module")
def reasoner(model_dir, tmp_path_factory):
    """A bare .pte with a reasoning template from --hf-tokenizer, a 480-token context (of 512), --no-think."""
    hf = _tokenizer_dir(tmp_path_factory.mktemp("hf-reasoner"), model_dir, REASONING_TEMPLATE)
    srv = CliServer("--model-path", str(model_dir / "model.pte"), "--hf-tokenizer", str(hf),
                    "--max-context", "480", "--no-think", "--model-id", "smol-reasoner")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def chat(srv: Server, **body) -> requests.Response:
    body.setdefault("temperature", 0)
    return requests.post(srv.base_url + "/v1/chat/completions", json=body, timeout=120)


def stream_chunks(srv: Server, **body) -> list[dict]:
    body.setdefault("temperature", 0)
    chunks = []
    with requests.post(srv.base_url + "/v1/chat/completions", json={**body, "stream": True},
                       stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                chunks.append(json.loads(line[6:]))
    return chunks


def prompt_of(srv: Server, **body) -> str:
    r = requests.post(srv.base_url + "/apply-template", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def assert_error(r: requests.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "code", "param"} and error["code"] == code
    return error


# --- the command line and settings -----------------------------------------------------------

def test_switches_take_no_value_and_read_env_booleans():
    from app.__main__ import parser

    args = parser().parse_args(["--no-think", "--allow-chatml-fallback", "--max-context", "128"])
    assert (args.no_think, args.allow_chatml_fallback, args.max_context) == ("1", "1", "128")
    assert parser().parse_args([]).no_think is None  # unset: the environment decides
    s = Settings.from_env({"ETSERVE_NO_THINK": "yes", "ETSERVE_ALLOW_CHATML_FALLBACK": "0"})
    assert s.no_think is True and s.allow_chatml_fallback is False and s.max_context == 0
    assert Settings.from_env({}).no_think is False
    with pytest.raises(ValueError, match="no_think"):
        Settings.from_env({"ETSERVE_NO_THINK": "maybe"})


def test_max_context_caps_the_served_context(reasoner):
    models = requests.get(reasoner.base_url + "/v1/models", timeout=10).json()["data"]
    assert [(m["id"], m["context_length"]) for m in models] == [("smol-reasoner", 480)]
    long = " ".join(["word"] * 600)
    error = assert_error(chat(reasoner, messages=[{"role": "user", "content": long}], max_tokens=1),
                         400, "context_length_exceeded")
    assert "480" in error["message"]
    # a prompt that fits the .pte's 512 but not the 480 the server uses
    error = assert_error(chat(reasoner, messages=[{"role": "user", "content": " ".join(["word"] * 470)}],
                              max_tokens=1), 400, "context_length_exceeded")
    assert "480" in error["message"] and 480 < int(error["message"].split("the prompt has ")[1].split()[0]) < 512
    # max_tokens past the 480 is cut to the room left
    r = chat(reasoner, messages=[{"role": "user", "content": "Hi"}], max_tokens=470)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["total_tokens"] <= 480
    tok = requests.post(reasoner.base_url + "/tokenize", json={"prompt": "hi"}, timeout=10).json()
    assert tok["max_model_len"] == 480


def test_no_think_is_the_default_and_a_request_can_turn_thinking_back_on(reasoner):
    messages = [{"role": "user", "content": "Hi"}]
    assert prompt_of(reasoner, messages=messages).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert prompt_of(reasoner, messages=messages, chat_template_kwargs=THINK).endswith(
        "<|im_start|>assistant\n<think>\n")
    r = chat(reasoner, messages=messages, max_tokens=8)
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["content"] and "reasoning_content" not in message


def test_clients_thinking_dialects_reach_the_template(reasoner):
    """reasoning_effort (OpenAI), enable_thinking (Qwen, DashScope), thinking.type (DeepSeek, Z.ai):
    accepted, and the template renders as they ask; a default effort does not undo --no-think."""
    messages = [{"role": "user", "content": "Hi"}]
    on, off = "<|im_start|>assistant\n<think>\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    cases = [({"reasoning_effort": "high"}, off),  # --no-think stands: agents send an effort by default
             ({"reasoning_effort": "none"}, off),
             ({"enable_thinking": True}, on),
             ({"thinking": {"type": "enabled"}}, on),
             ({"thinking": {"type": "enabled"}, "enable_thinking": False}, off),
             ({"reasoning_effort": "minimal", "enable_thinking": True}, on),
             ({"enable_thinking": True, "chat_template_kwargs": {"enable_thinking": False}}, off)]
    for extra, ending in cases:
        assert prompt_of(reasoner, messages=messages, **extra).endswith(ending), extra
    r = chat(reasoner, messages=messages, max_tokens=4, reasoning_effort="low")  # pi's and opencode's field
    assert r.status_code == 200, r.text
    for extra, param in [({"reasoning_effort": "hot"}, "reasoning_effort"), ({"enable_thinking": "yes"}, "enable_thinking"),
                         ({"thinking": {"type": "maybe"}}, "thinking.type")]:
        assert assert_error(chat(reasoner, messages=messages, **extra), 400, "invalid_value")["param"] == param
    r = requests.post(reasoner.base_url + "/v1/responses", timeout=60,
                      json={"input": "Hi", "max_output_tokens": 4, "reasoning": {"effort": "minimal"}})
    assert r.status_code == 200 and r.json()["reasoning"]["effort"] == "minimal", r.text
    r = requests.post(reasoner.base_url + "/v1/responses", timeout=60,
                      json={"input": "Hi", "max_output_tokens": 4, "reasoning": {"effort": "turbo"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning.effort", r.text


def test_raise_exception_is_a_400_with_the_templates_message(reasoner):
    for stream in (False, True):
        r = chat(reasoner, messages=[{"role": "assistant", "content": "Hello"}], stream=stream)
        error = assert_error(r, 400, "invalid_prompt")
        assert error["message"] == "Conversations must not start with an assistant message"
        assert error["param"] == "messages" and error["type"] == "invalid_request_error"
    r = requests.post(reasoner.base_url + "/apply-template", timeout=10,
                      json={"messages": [{"role": "assistant", "content": "Hello"}]})
    assert_error(r, 400, "invalid_prompt")


# --- reasoning ----------------------------------------------------------------------------

def test_reasoning_is_split_out_of_the_message(reasoner):
    r = chat(reasoner, messages=few_shot("What is 3+3?"), max_tokens=40, logprobs=True,
             chat_template_kwargs=THINK)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    message = choice["message"]
    raw = "".join(t["token"] for t in choice["logprobs"]["content"])  # what the model really wrote
    assert "</think>" in raw and "</think>" not in [t["token"] for t in choice["logprobs"]["content"]], \
        "the close tag should come in several tokens"
    assert message["reasoning_content"] and message["content"]
    for part in (message["reasoning_content"], message["content"]):
        assert "think>" not in part and "</" not in part
    split = split_reasoning(raw.removesuffix("<|im_end|>"), started=True)
    assert (message["reasoning_content"], message["content"]) == (split.reasoning, split.content)
    assert "3" in message["reasoning_content"]
    assert choice["finish_reason"] == "stop"


def test_reasoning_streams_as_reasoning_content_deltas(reasoner):
    body = dict(messages=few_shot("What is 3+3?"), max_tokens=40, chat_template_kwargs=THINK)
    whole = chat(reasoner, **body).json()["choices"][0]["message"]
    chunks = stream_chunks(reasoner, **body, logprobs=True)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    kinds = [k for d in deltas for k in ("reasoning_content", "content") if d.get(k)]
    assert kinds.count("reasoning_content") >= 3, "reasoning should arrive token by token"
    first_content = kinds.index("content")
    assert set(kinds[:first_content]) == {"reasoning_content"} and set(kinds[first_content:]) == {"content"}
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (reasoning, content) == (whole["reasoning_content"], whole["content"])
    assert all("think>" not in d.get("reasoning_content", "") + d.get("content", "") for d in deltas)
    # every generated token's logprob is reported once, reasoning tokens included
    tokens = [t["token"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
              for t in c["choices"][0]["logprobs"]["content"]]
    assert "".join(tokens).startswith(reasoning.split()[0]) and "</" in tokens
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_output_cut_inside_the_reasoning_is_all_reasoning(reasoner):
    body = dict(messages=[{"role": "user", "content": "Tell me about the sea."}], max_tokens=6,
                chat_template_kwargs=THINK)
    choice = chat(reasoner, **body).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == "" and choice["message"]["reasoning_content"]
    deltas = [c["choices"][0]["delta"] for c in stream_chunks(reasoner, **body) if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == choice["message"]["reasoning_content"]
    assert "".join(d.get("content", "") for d in deltas) == ""


def test_constrained_output_is_not_split(reasoner):
    """response_format's grammar covers the whole output, so even with thinking on it is all content."""
    r = chat(reasoner, messages=[{"role": "user", "content": "Give me a JSON object."}], max_tokens=24,
             chat_template_kwargs=THINK, response_format={"type": "json_object"})
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert "reasoning_content" not in message and message["content"].lstrip().startswith("{")


# --- no chat template: refused, or ChatML with --allow-chatml-fallback --------------------------

@pytest.fixture(scope="module")
def bare_tokenizer(model_dir, tmp_path_factory) -> Path:
    return _tokenizer_dir(tmp_path_factory.mktemp("no-template"), model_dir, None) / "tokenizer.json"


def _serve(model_dir: Path, env: dict[str, str], status: str = "ok") -> Server:
    srv = Server(model_dir / "model.pte", env)
    try:
        srv.wait_ready(status=status)
    except Exception:
        srv.stop()
        raise
    return srv


def test_a_tokenizer_without_template_is_refused_by_default(model_dir, bare_tokenizer):
    srv = _serve(model_dir, {"ETSERVE_TOKENIZER_PATH": str(bare_tokenizer)})
    try:
        error = assert_error(chat(srv, messages=[{"role": "user", "content": "Hi"}]), 400, "no_chat_template")
        assert "no chat template" in error["message"]
        r = requests.post(srv.base_url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
        assert r.status_code == 200, r.text  # the model itself is served
    finally:
        srv.stop()


def test_chatml_fallback(model_dir, bare_tokenizer):
    srv = _serve(model_dir, {"ETSERVE_TOKENIZER_PATH": str(bare_tokenizer.parent),
                             "ETSERVE_ALLOW_CHATML_FALLBACK": "1"})
    try:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]
        assert prompt_of(srv, messages=messages) == (
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSay hello.<|im_end|>\n"
            "<|im_start|>assistant\n")
        r = chat(srv, messages=messages, max_tokens=48)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["message"]["content"] and "<|im_" not in choice["message"]["content"]
        assert "reasoning_content" not in choice["message"]
        assert "plain ChatML" in srv.log_path.read_text()
    finally:
        srv.stop()


# --- start-up errors -------------------------------------------------------------------------

def test_max_context_beyond_the_pte_fails_to_start_with_a_clear_message(model_dir):
    srv = _serve(model_dir, {"ETSERVE_MAX_CONTEXT": "1024"}, status="failed")
    try:
        assert requests.get(srv.base_url + "/health", timeout=5).status_code == 503
        assert ("--max-context 1024 is larger than the model's context: the .pte was exported with "
                "max_seq_len 512") in srv.log_path.read_text()
    finally:
        srv.stop()


def test_hf_tokenizer_without_config_fails_to_start(model_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_text((model_dir / "tokenizer.json").read_text())
    srv = _serve(model_dir, {"ETSERVE_HF_TOKENIZER": str(tmp_path)}, status="failed")
    try:
        assert f"--hf-tokenizer {tmp_path} has no tokenizer_config.json" in srv.log_path.read_text()
    finally:
        srv.stop()


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def tool_few_shot(city: str) -> list[dict]:
    """Worked turns that reason, then call the tool: the small model copies the pattern."""
    messages = [{"role": "system", "content": "Think inside <think></think>, then call a tool."}]
    for i, c in enumerate(["Paris", "Tokyo"]):
        messages += [
            {"role": "user", "content": f"Weather in {c}?"},
            {"role": "assistant", "content": f"<think>\nThe user wants the weather in {c}.\n</think>\n\n",
             "tool_calls": [{"id": f"call_{i}", "type": "function",
                             "function": {"name": "get_weather", "arguments": json.dumps({"city": c})}}]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "sunny"},
        ]
    return messages + [{"role": "user", "content": f"Weather in {city}?"}]


def test_reasoning_comes_out_before_tool_calls_are_parsed(reasoner):
    body = dict(messages=tool_few_shot("Oslo"), tools=WEATHER, max_tokens=60, chat_template_kwargs=THINK)
    r = chat(reasoner, **body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert "Oslo" in choice["message"]["reasoning_content"]
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert not choice["message"]["content"]
    chunks = stream_chunks(reasoner, **body)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == choice["message"]["reasoning_content"]
    calls = [t for d in deltas for t in d.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(t["function"]["arguments"] for t in calls)) == {"city": "Oslo"}
    assert not "".join(d.get("content", "") for d in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
