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
from pathlib import Path

import pytest

from . import agents

VERSION = "1.18.33"
TURN_TIMEOUT = 1200  # seconds: a ~7,200-token prompt read on two shared cores


@pytest.fixture(scope="module")
def opencode(tmp_path_factory) -> Path:
    return agents.installed("opencode", VERSION, tmp_path_factory.mktemp("opencode-version"))


@pytest.fixture(scope="module")
def session(qwen_server, tmp_path_factory):
    """(environment, project directory with docs/clients.md's opencode.json, model id)."""
    model, context = agents.served_model(qwen_server)
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
    closed = agents.CLOSED_REGISTRY  # nothing is fetched while the test runs
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": str(tmp_path_factory.mktemp("opencode-home")),
           "npm_config_registry": closed, "BUN_CONFIG_REGISTRY": closed,
           "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
           "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_SHARE": "1"}
    return env, work, model


def run_turn(opencode: Path, session, server, message: str, *extra: str) -> tuple[list[dict], list[tuple]]:
    """One `opencode run` turn: its JSON events and the chat requests it made (agents.run_turn)."""
    env, work, model = session
    return agents.run_turn([str(opencode), "run", "--pure", "--format", "json", "--title", "test",
                            "-m", f"etserve/{model}", *extra, message], work, env, server, TURN_TIMEOUT)


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
