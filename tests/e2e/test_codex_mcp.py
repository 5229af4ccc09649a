"""Codex CLI with an MCP server configured (tests/clients/mcp_server.py, a stdio server of the
tests' own): Codex offers the server's tool as a `namespace` tool; the model is offered it as a
function, its call comes back with the namespace Codex dispatches on, and the call reaches the
MCP server; the tool's output goes back in the next request and the turn completes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from .test_codex_cli import TURN_TIMEOUT, codex, events  # noqa: F401  (codex is a fixture)

MCP_SERVER = Path(__file__).resolve().parents[1] / "clients" / "mcp_server.py"


@pytest.fixture(scope="module")
def codex_mcp_env(qwen_server, tmp_path_factory):
    home = tmp_path_factory.mktemp("codex-mcp-home")
    calls = home / "mcp-calls.log"
    model = requests.get(qwen_server.base_url + "/v1/models", timeout=10).json()["data"][0]["id"]
    (home / "config.toml").write_text(
        f'model = "{model}"\n'
        'model_provider = "etserve"\n'
        '[model_providers.etserve]\n'
        'name = "etserve"\n'
        f'base_url = "{qwen_server.base_url}/v1"\n'
        'wire_api = "responses"\n'
        '[mcp_servers.codeword]\n'
        f'command = "{sys.executable}"\n'
        f'args = ["{MCP_SERVER}"]\n'
        '[mcp_servers.codeword.env]\n'
        f'MCP_CALL_LOG = "{calls}"\n')
    work = tmp_path_factory.mktemp("codex-mcp-work")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update(CODEX_HOME=str(home), NO_COLOR="1")
    return env, work, calls


def test_codex_calls_a_tool_of_its_mcp_server_through_etserve(codex, codex_mcp_env):  # noqa: F811
    """Codex sends no temperature (the API's default, 1): whether the 0.5B model calls the tool is
    sampled. Each attempt is a fresh thread; every one must complete, one must call the tool."""
    env, work, calls = codex_mcp_env
    attempts = []
    for _ in range(16):  # measured 13 of 27 attempts, then 4 of 12 (1-7 s each): 16 fail together 0.2%
        run = subprocess.run(
            [str(codex), "exec", "--skip-git-repo-check", "--color", "never", "--json",
             "--dangerously-bypass-approvals-and-sandbox",  # MCP calls need approval otherwise; exec cannot ask
             "Call the lookup_code_word tool now (it takes no arguments). Then reply with the code word it returns."],
            cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TURN_TIMEOUT)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        out = events(run.stdout)
        assert [e for e in out if e.get("type") == "turn.completed"], out
        mcp = [e["item"] for e in out if e.get("type") == "item.completed"
               and e["item"].get("type") == "mcp_tool_call"]
        attempts.append(mcp)
        if mcp:
            break
    print(f"\nMCP calls per attempt: {[len(a) for a in attempts]}")
    mcp = attempts[-1]
    assert mcp, (f"in {len(attempts)} attempts the model never called the MCP tool", attempts)
    assert mcp[0]["server"] == "codeword" and mcp[0]["tool"] == "lookup_code_word", mcp
    assert mcp[0]["status"] == "completed" and "PERIWINKLE-42" in json.dumps(mcp[0]["result"]), mcp
    assert calls.exists() and json.loads(calls.read_text().splitlines()[0])["name"] == "lookup_code_word"


CORPUS = Path(__file__).resolve().parents[1] / "clients" / "corpus"


@pytest.mark.parametrize("name", ["codex-0.171.0-mcp-tool-output", "codex-0.171.0-history-image-apply-patch"])
def test_codex_histories_go_on_to_another_turn(qwen_server, name):
    """Codex's requests replayed as it sends them (the whole history each turn): a namespaced
    call and its output, a pasted image, an apply_patch call, a shell call, a compaction item."""
    spec = json.loads((CORPUS / f"{name}.json").read_text())
    with requests.post(qwen_server.base_url + spec["route"], json=spec["body"], stream=True, timeout=TURN_TIMEOUT) as r:
        assert r.status_code == 200, r.text
        kinds = [json.loads(line[6:])["type"] for line in r.iter_lines(decode_unicode=True)
                 if line and line.startswith("data: ")]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete"), kinds
    assert "response.output_item.done" in kinds
