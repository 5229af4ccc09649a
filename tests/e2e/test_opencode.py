"""opencode itself (npm opencode-ai, pinned; `make agents` installs it) completes turns against
the default model served for real, configured as docs/clients.md shows it: a provider over
`@ai-sdk/openai-compatible` on /v1/chat/completions. Its requests carry its system prompt and
its ten tools (~7,200 tokens with Qwen's tokenizer: the long-context build). Checked per turn:
the reply reaches opencode, the usage it reads (input, output, cache read) is what the server
logged for that request, and the next turn of the session (`--continue`) reads the conversation
from the KV cache.

Hermetic: `--pure` (no plugins to fetch), the npm registry pointed at a closed local port, model
list, update and share fetches off; the session lives in a temporary HOME.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import requests

AGENTS_DIR = Path(os.environ.get("ETSERVE_AGENTS_DIR", Path.home() / ".cache" / "etserve" / "agents"))
OPENCODE = AGENTS_DIR / "node_modules" / ".bin" / "opencode"
VERSION = "1.18.33"
TURN_TIMEOUT = 1200  # seconds: a ~7,200-token prompt read on two shared cores


@pytest.fixture(scope="module")
def opencode(tmp_path_factory) -> Path:
    if not OPENCODE.exists():
        pytest.fail(f"opencode is not installed at {OPENCODE}: run `make agents`")
    out = subprocess.run([str(OPENCODE), "--version"], capture_output=True, text=True, timeout=60,
                         env={"PATH": os.environ["PATH"], "HOME": str(tmp_path_factory.mktemp("opencode-version"))})
    assert VERSION in out.stdout, out.stdout + out.stderr
    return OPENCODE


@pytest.fixture(scope="module")
def session(qwen_server, tmp_path_factory):
    """(environment, project directory with docs/clients.md's opencode.json, model id)."""
    info = requests.get(qwen_server.base_url + "/v1/models", timeout=10).json()["data"][0]
    model, context = info["id"], info["context_length"]
    work = tmp_path_factory.mktemp("opencode-work")
    (work / "opencode.json").write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json",
        "provider": {"etserve": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "etserve",
            "options": {"baseURL": qwen_server.base_url + "/v1", "apiKey": "anything"},
            "models": {model: {"name": "etserve test", "limit": {"context": context, "output": 1024}}},
        }},
    }))
    closed = "http://127.0.0.1:9/"  # the discard port: nothing is fetched while the test runs
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": str(tmp_path_factory.mktemp("opencode-home")),
           "npm_config_registry": closed, "BUN_CONFIG_REGISTRY": closed,
           "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
           "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_SHARE": "1"}
    return env, work, model


def run_turn(opencode: Path, session, server, message: str, *extra: str) -> tuple[list[dict], list[tuple]]:
    """One `opencode run` turn: its JSON events, and the access-log entries (status, prompt,
    cached, completion) of the chat requests it made."""
    env, work, model = session
    since = server.log_size()
    proc = subprocess.run([str(opencode), "run", "--pure", "--format", "json", "--title", "test",
                           "-m", f"etserve/{model}", *extra, message],
                          cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=TURN_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return events, server.generations_logged(since)


def check_turn(events: list[dict], requests_made: list[tuple]) -> dict:
    """The turn's reply reached opencode, and the usage it read is the server's: returns the
    last step's tokens."""
    assert requests_made and all(status == 200 for status, *_ in requests_made), requests_made
    texts = [e["part"]["text"] for e in events if e.get("type") == "text"]
    assert texts and texts[-1].strip(), events
    steps = [e["part"] for e in events if e.get("type") == "step_finish"]
    assert steps and steps[-1]["reason"] == "stop", events
    tokens = steps[-1]["tokens"]
    _, prompt, cached, completion = requests_made[-1]
    assert prompt > 4000, f"opencode's request should carry its system prompt and tools: {prompt} tokens"
    assert (tokens["input"], tokens["cache"]["read"], tokens["output"]) == (prompt - cached, cached, completion), \
        (tokens, requests_made[-1])
    return tokens


def test_opencode_completes_two_turns_from_the_cache(opencode, session, qwen_server):
    events, made = run_turn(opencode, session, qwen_server, "Reply with one word: hello")
    check_turn(events, made)
    first_prompt = made[-1][1]

    events, made = run_turn(opencode, session, qwen_server, "Now reply with one word: goodbye", "--continue")
    tokens = check_turn(events, made)
    # the conversation so far (its system prompt, tools, first turn) read from the KV cache
    assert tokens["cache"]["read"] >= first_prompt, (tokens, first_prompt)
