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
  claude code edit turn, on / off       a real Claude Code turn asked to edit a file (bench/data/
                                        edits/cancel.py copied into its working directory), start
                                        to exit, etserve with drafts ÷ without (reported; sampled
                                        at Claude Code's temperature, one turn each)
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import requests

from bench import peer
from bench.client import stream
from bench.models import label
from bench.servers import EtServe, LlamaServer
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
AGENT_PROMPT = ("In cancel.py, rename the class CancelToken to StopToken everywhere, and write the whole "
                "file back.")


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
                                                                      {"ETSERVE_DRAFT_MAX": "0"})}
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


def agent_edit_rows(args, results: dict) -> list[Row]:
    """A Claude Code editing turn against etserve with drafts and without (bench/agents.py runs it)."""
    from bench.agents import CLAUDE, run_claude
    from bench.client import get_json
    from bench.models import long_context_dir

    serve_dir = long_context_dir(args.model_dir)
    if not CLAUDE.exists() or serve_dir is None:
        return [Row(AGENT_EDIT, "a Claude Code editing turn", "not run (Claude Code or a 32k build missing)")]
    turns = {}
    for side, env in (("on", {}), ("off", {"ETSERVE_DRAFT_MAX": "0"})):
        scratch = Path(tempfile.mkdtemp(prefix="etserve-bench-edit-"))
        home, work = scratch / "home", scratch / "work"
        home.mkdir()
        work.mkdir()
        shutil.copy(EDITS / "cancel.py", work / "cancel.py")
        et = EtServe(serve_dir, args.threads, env)
        try:
            model = get_json(et.url, "/v1/models")["data"][0]["id"]
            turn = run_claude(et.url, model, AGENT_PROMPT, home, work)
            metrics = requests.get(et.url + "/metrics", timeout=30).text
            accepted = sum(float(line.split()[-1]) for line in metrics.splitlines()
                           if line.startswith("etserve_draft_accepted_tokens_total"))
            edited = "StopToken" in (work / "cancel.py").read_text()
        finally:
            et.stop()
            shutil.rmtree(scratch, ignore_errors=True)
        turns[side] = (turn, accepted, edited)
        log(f"  claude code edit, drafts {side}: {turn.seconds:.1f} s, exit {turn.returncode}, "
            f"file edited: {edited}, drafts accepted {accepted:.0f}")
    results["speculation_agent_edit"] = {k: {"seconds": t.seconds, "returncode": t.returncode, "accepted": a,
                                             "edited": e} for k, (t, a, e) in turns.items()}
    (on, a_on, e_on), (off, _, e_off) = turns["on"], turns["off"]
    return [Row(AGENT_EDIT, f"Claude Code asked to rename a class in a 64-line file, start to exit, etserve "
                f"drafts on ÷ --draft-max 0 (one sampled turn each; file edited: {e_on} / {e_off}; "
                f"{a_on:.0f} drafted tokens accepted)", f"{on.seconds:.1f} s / {off.seconds:.1f} s",
                on.seconds / off.seconds)]
