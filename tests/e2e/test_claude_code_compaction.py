"""Claude Code survives a context overflow by compacting: on a server whose context its conversation
outgrows, the turn that overflows gets Anthropic's 400 ('prompt is too long: N tokens > M
maximum'), Claude Code compacts the history through etserve (a summary request) and retries, and
the turn completes.

Claude Code runs with one tool (`--tools Read`): its first request is then ~2,400 tokens instead
of ~11,600 with its 21 default tools (test_claude_code.py runs those), and the context 7,424
tokens in place of 16,384, with the same room around each request (measured 2026-12-06: turns of
2,420 and 5,332 tokens, the overflow, compaction requests of 6,626 and 6,709, the retry 5,642):
the flow is the same and the cold prompts a third as long (the test took 150-170 s before, 45 s
after).

Measured on the way: a single message too big for the room left is not rescued by compacting
(the retry still holds it); the overflow must come from the history, as in a long session."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from . import agents
from .servers import Server
from .test_claude_code import claude  # noqa: F401  (a fixture)

CONTEXT = 7424
TURN_TIMEOUT = 1500
NOTES = "\n".join(f"Note {i}: the quick brown fox jumps over the lazy dog near the river bank." for i in range(150))


@pytest.fixture(scope="module")
def small_qwen(qwen_dir):
    # the cap bounds the test's time: Claude Code's summary request asks for thousands of tokens, and
    # how many the model writes before it stops varies from run to run (542 to 2,766 measured); a
    # summary cut at the cap ends with max_tokens, which Claude Code takes as its summary
    srv = Server(qwen_dir, {"ETSERVE_MAX_CONTEXT": str(CONTEXT), "ETSERVE_MAX_TOKENS_CAP": "800"})
    try:
        srv.wait_ready(timeout=300)
        yield srv
    finally:
        srv.stop()


def statuses(server, since: int) -> list[str]:
    """The status of each /v1/messages request since `since`, an error's code after it (400:context_length_exceeded)."""
    log = server.log_path.read_bytes()[since:].decode(errors="replace")
    return [status + (f":{code}" if code else "") for status, code in
            re.findall(r'"POST /v1/messages\?beta=true HTTP/1\.1" (\d{3}) .*?(?: error=(\w+))?$', log, re.M)]


def test_claude_code_compacts_when_its_history_outgrows_the_context(claude, small_qwen, tmp_path):  # noqa: F811
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8",
           "ANTHROPIC_BASE_URL": small_qwen.base_url, "ANTHROPIC_API_KEY": "anything",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    model, _ = agents.served_model(small_qwen)

    def turn(text: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(claude), "-p", *extra, text, "--model", model, "--tools", "Read"], cwd=work,
                              env=env, capture_output=True, text=True, timeout=TURN_TIMEOUT)

    first = turn("Reply with one word: hello")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    second = turn("Here are my notes:\n" + NOTES + "\nReply with one word: ok", "--continue")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    since = small_qwen.log_path.stat().st_size
    third = turn("More notes:\n" + NOTES + "\nReply with one word: done", "--continue")
    seen = statuses(small_qwen, since)
    print(f"\nthird turn: exit {third.returncode}, /v1/messages statuses {seen}\n{third.stdout[-500:]}")
    assert third.returncode == 0, (seen, third.stdout[-2000:], third.stderr[-2000:])
    assert third.stdout.strip()
    # the overflow (400), then the compaction's summary request and the retried turn (200s). A long
    # sampled summary can overflow the retry again (CI saw 400 200 400 400 200 200 200): Claude Code
    # compacts again; every refusal must be that overflow and the turn must end answered.
    overflow = "400:context_length_exceeded"
    assert seen[0] == overflow and "200" in seen and seen[-1] == "200", seen
    assert set(seen) == {overflow, "200"}, seen
