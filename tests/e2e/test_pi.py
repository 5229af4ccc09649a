"""pi, the coding agent (npm @mariozechner/pi-coding-agent, pinned; `make agents` installs it),
completes turns against the default model served for real, configured as docs/clients.md shows
it: a provider in ~/.pi/agent/models.json with `api: openai-completions` on
/v1/chat/completions. Checked per turn (`pi -p --mode json`): the reply reaches pi, the usage it
reads (input, output, cache read) is what the server logged for that request, and the next
turn of the session (`--continue`) reads the conversation from the KV cache.

Hermetic: `--offline`, the npm registry pointed at a closed local port; the session lives in a
temporary HOME.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from . import agents

VERSION = "0.73.1"
TURN_TIMEOUT = 600  # seconds: its ~1,400-token prompt read on two shared cores


@pytest.fixture(scope="module")
def pi(tmp_path_factory) -> Path:
    return agents.installed("pi", VERSION, tmp_path_factory.mktemp("pi-version"))


@pytest.fixture(scope="module")
def session(qwen_server, tmp_path_factory):
    """(environment whose HOME has docs/clients.md's models.json, project directory, model id)."""
    model, context = agents.served_model(qwen_server)
    home = tmp_path_factory.mktemp("pi-home")
    (home / ".pi" / "agent").mkdir(parents=True)
    (home / ".pi" / "agent" / "models.json").write_text(json.dumps({"providers": {"etserve": {
        "baseUrl": qwen_server.base_url + "/v1",
        "api": "openai-completions",
        "apiKey": "KEY",
        "models": [{"id": model, "name": "etserve test", "contextWindow": context, "maxTokens": 1024}],
    }}}))
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": str(home),
           "npm_config_registry": agents.CLOSED_REGISTRY}  # nothing is fetched while the test runs
    return env, tmp_path_factory.mktemp("pi-work"), model


def run_turn(pi: Path, session, server, message: str, *extra: str) -> tuple[list[dict], list[tuple]]:
    """One `pi -p` turn: its JSON events and the chat requests it made (agents.run_turn)."""
    env, work, model = session
    return agents.run_turn([str(pi), "--offline", "-p", "--mode", "json", "--provider", "etserve", "--model", model,
                            *extra, message], work, env, server, TURN_TIMEOUT)


def check_turn(events: list[dict], made: list[tuple]) -> dict:
    """The turn's reply reached pi, and the usage it read is the server's: returns it."""
    assert made and all(status == 200 for status, *_ in made), made
    ends = [e["message"] for e in events if e.get("type") == "message_end" and e["message"]["role"] == "assistant"]
    assert ends and ends[-1]["stopReason"] == "stop", events
    texts = [c["text"] for c in ends[-1]["content"] if c["type"] == "text"]
    assert texts and texts[-1].strip(), ends[-1]
    usage = ends[-1]["usage"]
    _, prompt, cached, completion = made[-1]
    assert prompt > 500, f"pi's request should carry its system prompt and tools: {prompt} tokens"
    assert (usage["input"], usage["cacheRead"], usage["output"]) == (prompt - cached, cached, completion), \
        (usage, made[-1])
    return usage


def test_pi_completes_two_turns_from_the_cache(pi, session, qwen_server):
    events, made = run_turn(pi, session, qwen_server, "Reply with one word: hello")
    check_turn(events, made)
    first_prompt = made[-1][1]

    events, made = run_turn(pi, session, qwen_server, "Now reply with one word: goodbye", "--continue")
    usage = check_turn(events, made)
    # the conversation so far (its system prompt, tools, first turn) read from the KV cache
    assert usage["cacheRead"] >= first_prompt, (usage, first_prompt)
