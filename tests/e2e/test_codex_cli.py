"""Codex CLI itself (npm @openai/codex, pinned; `make agents` installs it) completes turns against
the default model served for real, over /v1/responses: `codex exec` exits 0 with the model's
reply on stdout, and the next turn of the same conversation reads its prompt from the KV cache.

Codex's first request is ~6,000 tokens: the default model must be the long-context build."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from . import agents

VERSION = "0.171.0"
TURN_TIMEOUT = 1200  # seconds: a ~6,000-token prompt read on two shared cores, Codex's retries included


@pytest.fixture(scope="module")
def codex(tmp_path_factory) -> Path:
    return agents.installed("codex", VERSION, tmp_path_factory.mktemp("codex-version"))


@pytest.fixture(scope="module")
def codex_env(qwen_server, tmp_path_factory):
    """CODEX_HOME with a config.toml pointing at the server, as the README shows it."""
    home = tmp_path_factory.mktemp("codex-home")
    model, _ = agents.served_model(qwen_server)
    (home / "config.toml").write_text(
        f'model = "{model}"\n'
        'model_provider = "etserve"\n'
        '[model_providers.etserve]\n'
        'name = "etserve"\n'
        f'base_url = "{qwen_server.base_url}/v1"\n'
        'wire_api = "responses"\n')
    work = tmp_path_factory.mktemp("codex-work")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update(CODEX_HOME=str(home), NO_COLOR="1")
    return env, work


def run_codex(codex: Path, env: dict, work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(codex), "exec", "--skip-git-repo-check", "--color", "never", *args],
                          cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=TURN_TIMEOUT)


def events(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_codex_exec_completes_two_turns(codex, codex_env, qwen_server):
    env, work = codex_env
    _, context = agents.served_model(qwen_server)
    first = run_codex(codex, env, work, "Reply with one word: hello")
    assert first.returncode == 0, (
        f"codex exec failed (server context {context} tokens; Codex's first request needs ~6,000):\n"
        + first.stdout[-2000:] + first.stderr[-4000:])
    reply = first.stdout.strip()
    assert reply, first.stderr[-2000:]

    second = run_codex(codex, env, work, "--json", "resume", "--last", "Reply with one word: goodbye")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-4000:]
    out = events(second.stdout)
    messages = [e["item"]["text"] for e in out if e.get("type") == "item.completed"
                and e["item"].get("type") == "agent_message"]
    assert messages and messages[-1].strip(), out
    usage = [e["usage"] for e in out if e.get("type") == "turn.completed"]
    assert usage and usage[-1]["cached_input_tokens"] > 0, out
    assert usage[-1]["input_tokens"] > usage[-1]["cached_input_tokens"]
