"""Speculative decoding on code edits: etserve with and without drafts, and llama.cpp's server
with each of its draft-free `--spec-type`s, side by side (issue 35).

Each task is a real file (bench/data/edits: snapshots of three of the project's modules, so the
rows compare across runs) and an edit a coding agent asks for, answered with the whole file:
a rename, a new parameter threaded through, a reformat. Greedy, the model stops when it is done;
the row compares decode tok/s (tokens after the first over the time between the first and the
last), the median over the tasks. Every prompt starts with a line naming the run and the server,
so no server finds it cached.

  code edits, speculation on / off      etserve (the default --draft-max) ÷ --draft-max 0
                                        (target >= 2.0)
  code edits vs llama.cpp (best ngram)  etserve ÷ llama.cpp with the fastest of its ngram-*
                                        spec types on the same run (target >= 2.5); each type's
                                        figure is in the log and the row's text
  prose, speculation on / off           a story (nothing to copy): on ÷ off (target >= 0.97)
  claude code edit turn, on / off       real Claude Code turns given a file (bench/data/edits/
                                        cancel.py, also copied into its working directory) and
                                        asked to rename a class in it and write it back: decode
                                        tok/s over the turns' requests (access log), etserve with
                                        drafts ÷ without, 3 sampled turns each, alternating on two
                                        servers (reported, with wall times and how many turns
                                        edited the file: the 0.5B model rarely calls the tools)
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path

import requests

from bench import peer
from bench.client import stream
from bench.models import label
from bench.servers import NO_DRAFTS, EtServe, LlamaServer
from bench.table import Row, log, median

EDITS = Path(__file__).parent / "data" / "edits"
TASKS = [
    ("cancel.py", "Rename the class CancelToken to StopToken everywhere in this file (code, docstrings and "
                  "comments). Answer with the whole file and nothing else."),
    ("scheduler.py", "Add a field `weight: float = 1.0` to Claim, and make StepPolicy.key divide the service "
                     "by it. Answer with the whole file and nothing else."),
    ("table.py", "Reformat this file so that every string uses single quotes instead of double quotes. "
                 "Answer with the whole file and nothing else."),
]
STORY = "Write a long story about a lighthouse keeper and a storm."
EDIT_TOKENS = 900
STORY_TOKENS = 300
SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
ON_OFF = "code edits, speculation on / off"
VS_PEER = "code edits vs llama.cpp (best ngram)"
PROSE = "prose, speculation on / off"
AGENT_EDIT = "claude code edit turn, on / off"
AGENT_PROMPT = ("Here is cancel.py:\n```python\n{file}```\nRename the class CancelToken to StopToken everywhere "
                "in it (code, docstrings and comments), and write the whole new file to cancel.py.")
AGENT_TURNS = 3  # per side: Claude Code samples (temperature 1), the replies' lengths vary
AGENT_MAX_TOKENS = 2048  # per reply (the file is ~600 tokens): a sampled ramble measured 13,384 tokens, 6 minutes
# an access log line's completion tokens and decode time (app/http/generation_resource.py)
DECODE_LOG = re.compile(r"completion=(\d+) finish=\S+ queued=\d+ms prefill=\d+ms decode=(\d+)ms")


def _edit(url: str, tag: str, task: tuple[str, str], extra: dict) -> float:
    name, ask = task
    code = (EDITS / name).read_text()
    s = stream(url, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": f"# {tag}\n{ask}\n\n```python\n{code}```"}],
        "max_tokens": EDIT_TOKENS, "temperature": 0, **extra})
    return s.decode_tok_s


def _story(url: str, tag: str) -> float:
    return stream(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": f"{tag}: {STORY}"}],
                                                 "max_tokens": STORY_TOKENS, "temperature": 0}).decode_tok_s


def speculation_rows(args, results: dict) -> list[Row]:
    nonce = time.strftime("%H%M%S")
    rows: list[Row] = []
    et = {"on": EtServe(args.model_dir, args.threads), "off": EtServe(args.model_dir, args.threads,
                                                                      NO_DRAFTS)}
    edits: dict[str, list[float]] = {"on": [], "off": []}
    prose: dict[str, list[float]] = {"on": [], "off": []}
    try:
        log(f"speculative decoding: etserve {label(args.model_dir)}, the default --draft-max and 0")
        for side in ("on", "off"):
            _story(et[side].url, f"warm{nonce}{side}")  # lazy initialization
        for i, task in enumerate(TASKS):
            for side in (("on", "off") if i % 2 == 0 else ("off", "on")):
                tok_s = _edit(et[side].url, f"run {nonce} etserve-{side} {i}", task, {})
                edits[side].append(tok_s)
                log(f"  etserve {side}: {task[0]} {tok_s:.1f} tok/s")
        for r in range(2):
            for side in (("on", "off") if r % 2 == 0 else ("off", "on")):
                tok_s = _story(et[side].url, f"story {nonce} {side} {r}")
                prose[side].append(tok_s)
                log(f"  etserve {side}: story {tok_s:.1f} tok/s")
    finally:
        for s in et.values():
            s.stop()
    on, off = median(edits["on"]), median(edits["off"])
    results["speculation_edits_tok_s"] = edits
    results["speculation_prose_tok_s"] = prose
    rows.append(Row(ON_OFF, f"decode tok/s of {len(TASKS)} whole-file edits (rename, a new field, a reformat), "
                    "etserve with drafts ÷ without (median)", f"{on:.1f} / {off:.1f}", on / off, (">=", 2.0)))
    p_on, p_off = median(prose["on"]), median(prose["off"])
    rows.append(Row(PROSE, "decode tok/s of a story (nothing to copy), drafts on ÷ off (median of 2)",
                    f"{p_on:.1f} / {p_off:.1f}", p_on / p_off, (">=", 0.97)))

    peer_tok_s: dict[str, float] = {}
    gguf = peer.gguf_path()
    for spec in ("none",) + SPEC_TYPES:
        extra_args = () if spec == "none" else ("--spec-type", spec)
        try:
            llama = LlamaServer(peer.program("llama-server"), gguf, args.threads, 4096, extra_args=extra_args)
        except Exception as e:  # a type this build lacks
            log(f"  llama.cpp --spec-type {spec}: did not start ({e})")
            continue
        try:
            speeds = [_edit(llama.url, f"run {nonce} llama-{spec} {i}", task, {"cache_prompt": False})
                      for i, task in enumerate(TASKS)]
        finally:
            llama.stop()
        peer_tok_s[spec] = median(speeds)
        log(f"  llama.cpp --spec-type {spec}: {', '.join(f'{s:.1f}' for s in speeds)} tok/s")
    results["speculation_peer_tok_s"] = peer_tok_s
    tried = [k for k in peer_tok_s if k != "none"]
    if tried:
        best = max(tried, key=peer_tok_s.get)
        each = ", ".join(f"{k} {v:.1f}" for k, v in peer_tok_s.items())
        rows.append(Row(VS_PEER, f"the same edits' decode tok/s, etserve (drafts on) ÷ llama.cpp with its fastest "
                        f"draft-free --spec-type ({best}); each: {each}", f"{on:.1f} / {peer_tok_s[best]:.1f}",
                        on / peer_tok_s[best], (">=", 2.5)))
    else:
        rows.append(Row(VS_PEER, "llama.cpp's ngram spec types", "not run (none started)"))
    return rows


def _turn_decode(server, since: int) -> tuple[int, float]:
    """Completion tokens and decode seconds of the requests in the server's access log since `since`."""
    text = server.log_path.read_bytes()[since:].decode(errors="replace")
    found = DECODE_LOG.findall(text)
    return sum(int(c) for c, _ in found), sum(int(ms) for _, ms in found) / 1000


def agent_edit_rows(args, results: dict) -> list[Row]:
    """Claude Code editing turns against etserve with drafts and without, alternating, one server
    each (bench/agents.py runs the turns)."""
    from bench.agents import CLAUDE, run_claude
    from bench.client import get_json
    from bench.models import long_context_dir

    serve_dir = long_context_dir(args.model_dir)
    if not CLAUDE.exists() or serve_dir is None:
        return [Row(AGENT_EDIT, "a Claude Code editing turn", "not run (Claude Code or a 32k build missing)")]
    source = (EDITS / "cancel.py").read_text()
    servers: dict[str, EtServe] = {}
    turns: dict[str, list[dict]] = {"on": [], "off": []}
    try:
        servers["on"] = EtServe(serve_dir, args.threads)
        servers["off"] = EtServe(serve_dir, args.threads, NO_DRAFTS)
        model = get_json(servers["on"].url, "/v1/models")["data"][0]["id"]
        for i in range(AGENT_TURNS):
            for side in (("on", "off") if i % 2 == 0 else ("off", "on")):
                et = servers[side]
                scratch = Path(tempfile.mkdtemp(prefix="etserve-bench-edit-"))
                home, work = scratch / "home", scratch / "work"
                home.mkdir()
                work.mkdir()
                (work / "cancel.py").write_text(source)
                since = et.log_path.stat().st_size
                try:
                    turn = run_claude(et.url, model, AGENT_PROMPT.format(file=source), home, work,
                                      max_output_tokens=AGENT_MAX_TOKENS)
                    edited = "StopToken" in (work / "cancel.py").read_text()
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
                tokens, decode_s = _turn_decode(et, since)
                turns[side].append({"seconds": turn.seconds, "returncode": turn.returncode, "edited": edited,
                                    "renamed_in_reply": "StopToken" in turn.reply, "tokens": tokens,
                                    "decode_s": decode_s})
                log(f"  claude code edit, drafts {side}: {turn.seconds:.1f} s, exit {turn.returncode}, file edited: "
                    f"{edited}, {tokens} tokens decoded in {decode_s:.1f} s")
        accepted = sum(float(line.split()[-1]) for line in
                       requests.get(servers["on"].url + "/metrics", timeout=30).text.splitlines()
                       if line.startswith("etserve_draft_accepted_tokens_total"))
    finally:
        for et in servers.values():
            et.stop()
    results["speculation_agent_edit"] = turns
    rate = {side: sum(t["tokens"] for t in ts) / max(1e-9, sum(t["decode_s"] for t in ts)) for side, ts in turns.items()}
    wall = {side: median([t["seconds"] for t in ts]) for side, ts in turns.items()}
    count = {side: (sum(t["edited"] for t in ts), sum(t["renamed_in_reply"] for t in ts)) for side, ts in turns.items()}
    return [Row(AGENT_EDIT, f"Claude Code given a 64-line file and asked to rename a class in it and write it back, "
                f"{AGENT_TURNS} sampled turns per side alternating; decode tok/s over the turns' requests "
                f"(completion tokens ÷ decode time, access log), etserve drafts on ÷ --draft-max 0; turn wall "
                f"time medians {wall['on']:.1f} s / {wall['off']:.1f} s; file edited in {count['on'][0]} / "
                f"{count['off'][0]} turns, renamed class in the reply in {count['on'][1]} / {count['off'][1]}; "
                f"{accepted:.0f} drafted tokens accepted", f"{rate['on']:.1f} / {rate['off']:.1f} tok/s",
                rate["on"] / rate["off"] if rate["off"] else None)]
