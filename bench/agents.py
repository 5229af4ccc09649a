"""A coding agent's turn, end to end: Claude Code (`claude -p`, the version `make agents`
installs) against etserve and against llama.cpp's server, and a second conversation of the same
agent after etserve restarts.

    python -m bench.agents [--model-dir DIR] [--threads 2]

  claude code turn     wall time of one `claude -p "Reply with one word: hello"` from start to
                       exit (its first request is ~11,700 tokens: the system prompt and 12 tools),
                       llama.cpp ÷ etserve, so that above 1 is etserve faster. etserve serves its
                       32k default build with --session-dir; llama-server serves the Q4_0 GGUF
                       with `-c 32768 --jinja`; same threads; etserve first, then llama.cpp (one
                       turn each: a turn is minutes long).
  restart-warm turn    etserve is stopped (its states are written at exit) and started again on
                       the same --session-dir; Claude Code runs a second conversation (another
                       question, same directory: the same system prompt and tools). The row
                       is its time to first token ÷ the cold first turn's, both from etserve's
                       access log (queued + prefill). A second target: at least 90% of the
                       prompt came from the saved state (`cached=`).

Claude Code sends no temperature (the Messages default, 1): the replies are sampled, their
length varies, and the turn time includes the reply; the prompt dominates both.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import peer  # noqa: E402
from bench.client import get_json  # noqa: E402
from bench.models import LONG_CONTEXT, default_model_dir, label, long_context_dir  # noqa: E402
from bench.servers import EtServe, LlamaServer, ServerProcess  # noqa: E402
from bench.table import NOT_BUILT, Row, log, markdown  # noqa: E402

AGENTS_DIR = Path(os.environ.get("ETSERVE_AGENTS_DIR", Path.home() / ".cache" / "etserve" / "agents"))
CLAUDE = AGENTS_DIR / "node_modules" / ".bin" / "claude"
TURN = "claude code turn vs llama.cpp"
WARM = "restart-warm agent turn"
FIRST_PROMPT = "Reply with one word: hello"
SECOND_PROMPT = "Reply with one word: goodbye"
# etserve's access log, per request (gunicorn.conf.py, app/http/generation_resource.py)
LOG_LINE = re.compile(r'"POST /v1/messages\?beta=true HTTP/1\.1" (\d{3}) .*?prompt=(\d+) cached=(\d+) '
                      r'completion=(\d+) finish=(\S+) queued=(\d+)ms prefill=(\d+)ms')


@dataclass
class Turn:
    seconds: float  # Claude Code's start to exit
    returncode: int
    reply: str


@dataclass
class Logged:
    """One /v1/messages request as etserve's access log has it."""

    status: int
    prompt: int
    cached: int
    completion: int
    finish: str
    ttft_ms: int  # queued + prefill


def run_claude(url: str, model: str, prompt: str, home: Path, work: Path, timeout: float = 1800,
               max_output_tokens: int | None = None) -> Turn:
    """One `claude -p` turn; `max_output_tokens` caps each of its replies (it asks 32,000 otherwise)."""
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "ANTHROPIC_BASE_URL": url,
           "ANTHROPIC_API_KEY": "anything", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    if max_output_tokens is not None:
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(max_output_tokens)
    started = time.monotonic()
    proc = subprocess.run([str(CLAUDE), "-p", prompt, "--model", model], cwd=work, env=env,
                          capture_output=True, text=True, timeout=timeout)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        log(f"  claude exited {proc.returncode}: {(proc.stdout + proc.stderr)[-1500:]!r}")
    return Turn(seconds, proc.returncode, proc.stdout.strip())


def logged_requests(server: ServerProcess, since: int) -> list[Logged]:
    text = server.log_path.read_bytes()[since:].decode(errors="replace")
    return [Logged(int(m[1]), int(m[2]), int(m[3]), int(m[4]), m[5], int(m[6]) + int(m[7]))
            for m in LOG_LINE.finditer(text)]


def log_size(server: ServerProcess) -> int:
    return server.log_path.stat().st_size


def agent_rows(args, results: dict) -> list[Row]:
    """Both rows; 'not run' rows when Claude Code, the peer or a 32k build is missing."""
    serve_dir = long_context_dir(args.model_dir)
    if not CLAUDE.exists():
        return not_run(f"Claude Code not installed at {CLAUDE} (make agents)")
    if serve_dir is None:
        return not_run(f"{NOT_BUILT}: needs a ctx{LONG_CONTEXT} build of {args.model_dir.name}")
    name = label(serve_dir)
    state_dir = Path(tempfile.mkdtemp(prefix="etserve-bench-sessions-"))
    scratch = Path(tempfile.mkdtemp(prefix="etserve-bench-claude-"))
    home, work = scratch / "home", scratch / "work"
    home.mkdir()
    work.mkdir()
    env = {"ETSERVE_SESSION_DIR": str(state_dir)}
    rows: list[Row] = []
    try:
        log(f"Claude Code against etserve {name} (--session-dir {state_dir})")
        et = EtServe(serve_dir, args.threads, env)
        try:
            model = get_json(et.url, "/v1/models")["data"][0]["id"]  # llama-server takes any name
            since = log_size(et)
            et_turn = run_claude(et.url, model, FIRST_PROMPT, home, work)
            cold = logged_requests(et, since)
        finally:
            et.stop()  # the worker writes its states at exit (gunicorn's worker_exit)
        log(f"  {et_turn.seconds:.1f} s, exit {et_turn.returncode}, reply {et_turn.reply[:60]!r}; requests {cold}")

        llama_turn = None
        missing = None if peer.is_built() and peer.gguf_path().is_file() else "llama.cpp not built (make bench-peer)"
        if missing is None:
            log("Claude Code against llama-server -c 32768 --jinja")
            with LlamaServer(peer.program("llama-server"), peer.gguf_path(), args.threads, LONG_CONTEXT,
                             ("--jinja",)) as llama:
                llama_turn = run_claude(llama.url, model, FIRST_PROMPT, home, work)
            log(f"  {llama_turn.seconds:.1f} s, exit {llama_turn.returncode}, reply {llama_turn.reply[:60]!r}")

        log("etserve restarted on the same --session-dir: a second Claude Code conversation")
        et = EtServe(serve_dir, args.threads, env)
        try:
            since = log_size(et)
            warm_turn = run_claude(et.url, model, SECOND_PROMPT, home, work)
            warm = logged_requests(et, since)
        finally:
            et.stop()
        log(f"  {warm_turn.seconds:.1f} s, exit {warm_turn.returncode}, reply {warm_turn.reply[:60]!r}; requests {warm}")
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)

    results["agents"] = {"etserve_turn": et_turn.__dict__, "cold_requests": [c.__dict__ for c in cold],
                         "llama_turn": llama_turn.__dict__ if llama_turn else None,
                         "warm_turn": warm_turn.__dict__, "warm_requests": [w.__dict__ for w in warm]}
    ok = lambda t, reqs: t.returncode == 0 and reqs and all(r.status == 200 for r in reqs)  # noqa: E731
    what = (f"Claude Code's first turn (\"{FIRST_PROMPT}\"), start to exit, llama.cpp ÷ etserve; "
            f"etserve {name}, llama-server -c {LONG_CONTEXT} --jinja on the Q4_0 GGUF")
    if not ok(et_turn, cold):
        rows.append(Row(TURN, what, f"etserve's turn failed (exit {et_turn.returncode}, {cold})", target=(">=", 1.0)))
    elif llama_turn is None:
        rows.append(Row(TURN, what, f"etserve {et_turn.seconds:.0f} s; llama.cpp n/a: {missing}", target=(">=", 1.0)))
    elif llama_turn.returncode != 0:
        rows.append(Row(TURN, what, f"etserve {et_turn.seconds:.0f} s; llama.cpp's turn failed "
                        f"(exit {llama_turn.returncode})", target=(">=", 1.0)))
    else:
        first = max(cold, key=lambda r: r.prompt)
        rows.append(Row(TURN, f"{what} ({first.prompt:,} prompt tokens)",
                        f"{et_turn.seconds:.1f} s / {llama_turn.seconds:.1f} s",
                        llama_turn.seconds / et_turn.seconds, (">=", 1.0)))

    what = ("time to first token of a second Claude Code conversation after etserve restarted on the same "
            "--session-dir ÷ the cold first turn's (etserve's log: queued + prefill)")
    if not (ok(et_turn, cold) and ok(warm_turn, warm)):
        rows.append(Row(WARM, what, f"a turn failed (exits {et_turn.returncode}, {warm_turn.returncode})",
                        target=("<=", 0.1)))
        return rows
    first, second = max(cold, key=lambda r: r.prompt), max(warm, key=lambda r: r.prompt)
    share = second.cached / second.prompt
    rows.append(Row(WARM, f"{what}; {second.cached:,} of {second.prompt:,} prompt tokens cached "
                    f"({share:.1%}, target ≥ 90%)", f"{second.ttft_ms / 1000:.2f} s / {first.ttft_ms / 1000:.2f} s",
                    second.ttft_ms / max(first.ttft_ms, 1), ("<=", 0.1)))
    if share < 0.9:
        rows.append(Row(WARM + " cached", "share of the second conversation's prompt read from the saved state",
                        f"{second.cached:,} / {second.prompt:,}", share, (">=", 0.9)))
    return rows


def not_run(why: str) -> list[Row]:
    return [Row(TURN, "Claude Code's first turn vs llama.cpp", f"n/a: {why}"),
            Row(WARM, "second conversation after a restart", f"n/a: {why}")]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    args.model_dir = args.model_dir or default_model_dir()
    print(markdown(agent_rows(args, {})))


if __name__ == "__main__":
    main()
