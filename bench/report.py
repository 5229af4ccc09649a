"""`make bench`: every ratio the bench measures, from one run, as one markdown table.

    python -m bench.report [--model-dir DIR] [--smol-dir DIR] [--threads 2] [--only own|peer|perplexity|fill|...]
    ETSERVE_ISA=avx2 python -m bench.report --only fill --no-doc   # decode at fill 12k on the AVX2 tier
    ETSERVE_CPU_MASK=avx2 python -m bench.report --only fill --no-doc   # the same as on an AVX2 host:
        # the workers see CPUID without AVX-512 (native/build/libcpu_mask.so), XNNPACK included

Builds no model: an input that is not built makes its rows say so (`make model` builds them).
The one thing it may build is the peer, llama.cpp's server, when its cache is missing
(bench/peer.py: once, outside the repository; --no-peer-build reports it missing instead).
Everything runs on this machine, one thing at a time; ratios are of measurements taken side by
side in this run, alternated A/B/B/A where it matters so that drift in the machine's load
cancels out. Progress goes to stderr, the table (with the date and the machine's load) to stdout,
and the same table with the host it ran on (CPU, instruction-set tier, date, commit) to
docs/benchmarks.md (--doc PATH elsewhere, --no-doc not at all): that page is this output, never
edited by hand.

Sections (each module's docstring says how its rows are measured):
  bench/own.py      etserve against its own parts: HTTP overhead, ExecuTorch's runner and kernels,
                    saved sessions, /health under load, memory, bandwidth, decode by fill, decode at fill
                    12k ÷ 128 naming the CPU tier that ran and the host (on a host above AVX2, again
                    with the CPUID masked to AVX2: the tier an older box runs; --only fill too)
  bench/versus.py   etserve against llama.cpp's server on the same model and threads: decode,
                    prefill, time to first token from 1k to 24k tokens, decode at fill 12k,
                    memory; bench/fim.py (fill-in-the-middle)
  bench/perplexity.py  perplexity per architecture (llama, qwen2, gemma3, and a qwen2 7B when
                    built): etserve's build of a GGUF against llama-perplexity on the same file
  bench/speculation.py  code edits with drafts on and off, and llama.cpp's ngram spec types
  bench/sharing.py  a shared box: an editor's infill while an agent's 12k prompt is read, four
                    chats at once, memory with the default slots (both servers' default slots)
  bench/big.py      a 7B GGUF: its build's memory and time, decode and prefill against llama.cpp
                    on the same file (--only big; its build is `make bench-7b`)
  bench/agents.py   Claude Code's first turn against both servers; a second conversation of the
                    same agent after etserve restarts on its --session-dir
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import agents, big, own, perplexity, sharing, speculation, versus  # noqa: E402
from bench.machine import cpu_model, cpu_tier, load_average, memory_bandwidth, native_build  # noqa: E402
from bench.models import default_model_dir, models_root  # noqa: E402
from bench.table import Row, log, markdown  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=None,
                   help=f"the served model (default: the default model's build, else {models_root()}/"
                        "qwen2.5-coder-0.5b/ctx2048-8da4w-sdpa while that is not built)")
    p.add_argument("--plain-dir", type=Path, default=None, help="its export without custom ops (default: sibling)")
    p.add_argument("--smol-dir", type=Path, default=models_root() / "smollm2-135m" / "ctx512-fp32-sdpa-r32")
    p.add_argument("--smol-plain-dir", type=Path, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", choices=("own", "peer", "perplexity", "sharing", "speculation", "fill", "big"),
                   default=None,
                   help="one section only (peer: against llama.cpp, perplexity included; perplexity: the "
                        "perplexity table alone; sharing: the shared-box rows alone; speculation: the code-edit "
                        "rows; fill: the decode-at-fill-12k row alone, e.g. with ETSERVE_CPU_MASK=avx2 (the workers "
                        "see an AVX2 host's CPUID) or ETSERVE_ISA=avx2 (our kernels only) to measure that tier; big: the 7B's rows, bench/big.py, only run when asked)")
    p.add_argument("--big-rounds", type=int, default=3, help="rounds of the 7B's decode and prefill rows")
    p.add_argument("--big-decode-tokens", type=int, default=32, help="tokens of the 7B's decode row")
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt of the decode comparisons")
    p.add_argument("--decode-tokens", type=int, default=64, help="tokens each decode comparison generates")
    p.add_argument("--rounds", type=int, default=3, help="alternated repetitions of each short comparison")
    p.add_argument("--long-rounds", type=int, default=2, help="alternated repetitions of the 12k and 24k prompts")
    p.add_argument("--lengths", default="1000,4000,12000,24000",
                   help="cold prompt lengths of the time-to-first-token rows (a shorter list skips the long ones)")
    p.add_argument("--fills", default="128,1500", help="context fills of the decode-by-fill rows")
    p.add_argument("--steps", type=int, default=32, help="decode steps per fill (custom-op exports)")
    p.add_argument("--plain-steps", type=int, default=12, help="decode steps per fill (exports without them)")
    p.add_argument("--history", type=int, default=1500, help="turn 1's prompt tokens (session restore)")
    p.add_argument("--other-tokens", type=int, default=300,
                   help="session restore: the conversation that takes the model between turns 1 and 2")
    p.add_argument("--session-repeat", type=int, default=1)
    p.add_argument("--skip-smol", action="store_true")
    p.add_argument("--skip-fim", action="store_true")
    p.add_argument("--fim-cases", type=int, default=None, help="the first N FIM cases only (default: all 20)")
    p.add_argument("--skip-perplexity", action="store_true", help="no perplexity table (bench/perplexity.py)")
    p.add_argument("--skip-agents", action="store_true", help="no Claude Code rows (they take ~10 min)")
    p.add_argument("--skip-speculation", action="store_true",
                   help="no speculative-decoding rows (bench/speculation.py: code edits, drafts on and off)")
    p.add_argument("--skip-sharing", action="store_true",
                   help="no shared-box rows (bench/sharing.py: an infill during an agent, four chats at once)")
    p.add_argument("--no-peer-build", action="store_true", help="report a missing peer instead of building it")
    p.add_argument("--json", type=Path, default=None, help="also write the raw measurements here")
    p.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks.md",
                   help="the generated benchmark page to rewrite (default: docs/benchmarks.md)")
    p.add_argument("--no-doc", action="store_true", help="print the table only; leave docs/benchmarks.md alone")
    args = p.parse_args(argv)
    args.model_dir = args.model_dir or default_model_dir()
    args.fills = [int(x) for x in args.fills.split(",")]
    args.lengths = [int(x) for x in args.lengths.split(",")]
    return args


PAGE_HEADER = """\
<!-- Generated by `make bench` (bench/report.py): rewritten at the end of each run; do not edit. -->
# Benchmarks

The ratios `make bench` measures, from its latest run on the host named below. How each row is
measured is in the docstring of its section: `bench/own.py` (etserve against its own parts) and
`bench/versus.py` (against llama.cpp's `llama-server` on the same model, built by
`make bench-peer`), with `bench/agents.py`, `bench/fim.py` and `bench/perplexity.py` (perplexity per
architecture: `llama-perplexity` on the very GGUF etserve's build was made from). Sides are
alternated (A B, B A, A B) so that drift in the machine's load cancels out; only ratios from one
run compare. `--only own`, `--only peer` or `--only perplexity` runs one section. The peer is built once by
`make bench-peer` into `~/.cache/etserve/peer/` (outside the repository) from the
`llama-cpp-python` sdist's vendored llama.cpp, and runs as `llama-server -t N -tb N -np 1
--cache-ram 0` (N the bench's `--threads`) on the model's GGUF requantized to Q4_0; a missing model build makes its rows
say `not built`. Earlier results are in [CHANGELOG.md](../CHANGELOG.md).
"""


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def benchmarks_page(table: str, when: str, argv, args, minutes: float, bandwidth: float | None,
                    commit: str | None = None) -> str:
    command = " ".join(["python -m bench.report", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    host = [
        f"- **Run**: {when}, commit `{commit or _commit()}`, {minutes:.1f} min: `{command}`",
        f"- **CPU**: {cpu_model()}, {os.cpu_count()} cores; instruction-set tier {cpu_tier()}",
        f"- **Native library**: {native_build()}",
        f"- **Threads**: {args.threads} runtime threads"
        + (f"; memory bandwidth (numpy copy) {bandwidth / 1e9:.1f} GB/s" if bandwidth else ""),
        f"- **Model**: `{args.model_dir}`",
    ]
    return PAGE_HEADER + "\n" + "\n".join(host) + "\n\n" + table + "\n"


README = ROOT / "README.md"
README_BEGIN = "<!-- bench:begin (written by `make bench`, bench/report.py; do not edit) -->"
README_END = "<!-- bench:end -->"


def readme_block(rows: list[Row], host: str) -> str:
    """The README's benchmark block: the rows against llama.cpp, their measured figures and ratios
    (the whole table, with targets, is docs/benchmarks.md), and the host they were measured on."""
    headline = [r for r in rows if "llama.cpp" in r.name and r.ratio is not None]
    lines = [f"The latest `make bench` against llama.cpp's server, same model and threads: {host}.", "",
             "| row | measured | ratio | target | met |", "|---|---|---|---|---|"]
    for r in headline:
        name, _, measured, ratio, target, met = r.cells()
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in (name, measured, ratio, target, met)) + " |")
    if not headline:
        lines = [f"The latest `make bench` ({host}) measured no row against llama.cpp."]
    return "\n".join(lines)


def rewrite_marked(text: str, content: str, begin: str = README_BEGIN, end: str = README_END) -> str:
    """`text` with what lies between the `begin` and `end` lines replaced by `content`; unchanged
    when either marker is missing (a README edited by hand keeps its words)."""
    start = text.find(begin)
    stop = text.find(end, start + len(begin)) if start >= 0 else -1
    if start < 0 or stop < 0:
        return text
    return text[:start + len(begin)] + "\n" + content.strip("\n") + "\n" + text[stop:]


def main(argv=None) -> None:
    args = parse_args(argv)
    started, load_start = time.monotonic(), load_average()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results: dict = {}
    rows = []
    bandwidth = None
    if args.only in (None, "own"):
        log(f"load average {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}; measuring memory bandwidth")
        bandwidth = memory_bandwidth(args.threads)
        results["bandwidth_bytes_s"] = bandwidth
        rows += own.default_section(args, bandwidth, results)
        if not args.skip_smol:
            rows += own.smol_section(args, results)
    if args.only == "fill":
        rows.append(own.fill_12k_row(args.model_dir, args.steps, args.threads, args.long_rounds, results))
        if own.avx2_row_wanted():  # and the AVX2 tier beside it
            rows.append(own.fill_12k_row(args.model_dir, args.steps, args.threads, args.long_rounds, results,
                                         cpu_mask="avx2"))
    if args.only == "big":
        rows += big.big_rows(args, results)
    if args.only in (None, "peer", "sharing", "speculation"):
        missing = versus.peer_ready(build=not args.no_peer_build)
        if missing:
            rows += versus.rows_not_run(missing)
        elif not (args.model_dir / "model.pte").is_file():
            rows += versus.rows_not_run(f"{args.model_dir} not built")
        else:
            if args.only not in ("sharing", "speculation"):
                rows += versus.peer_section(args, results)
            if not args.skip_sharing and args.only != "speculation":
                rows += sharing.sharing_rows(args, results)
            if not args.skip_speculation and args.only != "sharing":
                rows += speculation.speculation_rows(args, results)
                if not args.skip_agents:
                    rows += speculation.agent_edit_rows(args, results)
        if not args.skip_agents and args.only not in ("sharing", "speculation"):
            rows += agents.agent_rows(args, results)
    if args.only in (None, "peer", "perplexity") and not args.skip_perplexity:
        missing = versus.peer_ready(build=not args.no_peer_build)
        rows += perplexity.rows_not_run(missing) if missing else perplexity.perplexity_rows(args, results)
    load_end = load_average()
    minutes = (time.monotonic() - started) / 60
    machine = f"memory bandwidth (numpy copy, {args.threads} threads) {bandwidth / 1e9:.1f} GB/s; " if bandwidth else ""
    print(f"\n{when}, {os.cpu_count()} cores, {args.threads} runtime threads; load average at start "
          f"{load_start[0]:.2f} (5 min {load_start[1]:.2f}), at the end {load_end[0]:.2f}; {machine}"
          f"default model {args.model_dir}; {minutes:.1f} min\n")
    table = markdown(rows)
    print(table)
    if not args.no_doc:
        commit = _commit()  # before the page is written: it would make the tree dirty
        args.doc.write_text(benchmarks_page(table, when, argv, args, minutes, bandwidth, commit))
        log(f"wrote {args.doc}")
        if args.only is None and args.doc == ROOT / "docs" / "benchmarks.md":  # a whole run: the README's rows too
            host = f"{when}, {cpu_model()} ({os.cpu_count()} cores, tier {cpu_tier()}), commit `{commit}`"
            README.write_text(rewrite_marked(README.read_text(), readme_block(rows, host)))
            log(f"rewrote the benchmark block of {README}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
