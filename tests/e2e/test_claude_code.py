"""Claude Code itself (`claude -p`, the pinned npm version `make agents` installs) against the
default model served for real: it speaks only the Messages API (`POST /v1/messages?beta=true`,
streamed, with its system blocks, tools, thinking, context_management and metadata).

Its first request is ~11,700 tokens with Qwen's tokenizer: a full turn needs the long-context
build. On a build whose context is shorter, the request must still be accepted field by field
and refused only for its length, with Anthropic's error and words.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import requests

from . import agents

VERSION = "2.1.332"
# Its first request, captured (tests/anthropic/claude_code_request.json): the prompt size it needs.
CAPTURED = Path(__file__).resolve().parents[1] / "anthropic" / "claude_code_request.json"
REPLY_ROOM = 512  # tokens a short reply needs after the prompt
PROMPT = "Reply with one word: hello"


@pytest.fixture(scope="module")
def claude(tmp_path_factory) -> Path:
    return agents.installed("claude", VERSION, tmp_path_factory.mktemp("claude-version"))


@pytest.fixture(scope="module")
def fit(qwen_server) -> tuple[int, int]:
    """(tokens Claude Code's first request takes on this model, the model's context)."""
    body = json.loads(CAPTURED.read_text())
    r = requests.post(qwen_server.base_url + "/v1/messages/count_tokens", timeout=60,
                      json={k: body[k] for k in ("model", "system", "messages", "tools", "thinking")})
    assert r.status_code == 200, r.text
    return r.json()["input_tokens"], agents.served_model(qwen_server)[1]


def run_claude(claude: Path, server, tmp_path: Path, timeout: float) -> subprocess.CompletedProcess:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8",
           "ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "anything",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    model, _ = agents.served_model(server)
    return subprocess.run([str(claude), "-p", PROMPT, "--model", model], cwd=work, env=env,
                          capture_output=True, text=True, timeout=timeout)


def messages_statuses(server, since: int) -> list[str]:
    """Status codes of the POST /v1/messages?beta=true lines in the server's access log after `since` bytes."""
    log = server.log_path.read_bytes()[since:].decode(errors="replace")
    return re.findall(r'"POST /v1/messages\?beta=true HTTP/1\.1" (\d{3})', log)


def test_claude_code_completes_a_turn(claude, qwen_server, fit, tmp_path):
    needed, context = fit
    if needed + REPLY_ROOM > context:
        pytest.skip(f"Claude Code's first request is {needed} tokens; the default build holds {context}: "
                    "needs the long-context default model")
    since = qwen_server.log_path.stat().st_size
    proc = run_claude(claude, qwen_server, tmp_path, timeout=1800)
    print(f"\nclaude exit {proc.returncode}\nstdout: {proc.stdout!r}\nstderr: {proc.stderr[-2000:]!r}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    # The reply itself is sampled (Claude Code sends no temperature: the Messages API default, 1);
    # Qwen2.5-Coder-0.5B says "hello" most of the time, but one fresh-clone run got another 2-token reply
    # (server log: prompt=11640 completion=2 finish=stop). The turn is the proof: Claude Code
    # parsed our stream and printed the model's text.
    assert proc.stdout.strip(), (proc.stdout, proc.stderr[-4000:])
    statuses = messages_statuses(qwen_server, since)
    assert statuses and set(statuses) == {"200"}, statuses


def test_claude_codes_request_is_refused_only_for_its_length(claude, qwen_server, fit, tmp_path):
    """With a context shorter than its prompt: every field, role and tool of its real request is
    accepted; the one refusal is a 400 whose message says the prompt is too long."""
    needed, context = fit
    if needed < context:
        pytest.skip(f"the default build holds {context} tokens: Claude Code's {needed}-token request fits")
    since = qwen_server.log_path.stat().st_size
    proc = run_claude(claude, qwen_server, tmp_path, timeout=600)
    out = proc.stdout + proc.stderr
    print(f"\nclaude exit {proc.returncode}\noutput: {out[-2000:]!r}")
    assert proc.returncode != 0
    # Claude Code recognizes Anthropic's words and says so in its own ("Prompt is too long · ...")
    assert "prompt is too long" in out.lower(), out[-4000:]
    statuses = messages_statuses(qwen_server, since)
    assert statuses and set(statuses) == {"400"}, statuses
