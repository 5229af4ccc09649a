"""The speed tables of issues 7 and 3, measured in one run, as one markdown table of ratios.

    python -m bench.report [--model-dir DIR] [--smol-dir DIR] [--threads 2]      (make bench)

Builds nothing and writes no model: an input that is not built makes its row say so.
Everything runs on this machine, one thing at a time; ratios are of measurements taken side
by side in this run, alternated A/B/B/A where it matters so that drift in the machine's load
cancels out. Progress goes to stderr, the table to stdout.

Issue 7, on the default model (--model-dir) served by the real gunicorn config:
  (a) decode tok/s streamed over HTTP (/v1/completions, greedy, EOS banned by logit_bias so
      every run decodes the same number of tokens) / decode tok/s of the same .pte, prompt and
      sampling driven by a bare native loop (bench/workers.py `ours`, NativeModel in its own
      process): the server's overhead
  (b) turn-2 time to first token of a conversation with a --history token first turn, after
      another conversation took the model: warm (its session restored) / cold (bench/sessions.py)
  (c) the HTTP decode rate of (a) / ExecuTorch's own runner (TextLLMRunner) on the same .pte,
      prompt text and number of new tokens
  (d) /health latency p50 / p99, polled at 20 Hz while (b)'s streamed generations run
  (e) the gunicorn worker's resident memory (VmRSS) at the end / .pte size
  (f) the bare native decode rate of (a) / the memory bandwidth limit (see bytes_per_token)
Issue 3: decode tok/s at fill 128 and 1,500 for the exports with and without the custom ops
  (bench/workers.py `ours`); and SmolLM2 (--smol-dir) decode tok/s over HTTP / ExecuTorch's own
  custom-op kernels (bench/workers.py `et`, the wheel's pybinding) on the same .pte.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (HealthPoller, Server, Worker, WorkerError, code_prompt, default_model_dir,  # noqa: E402
                          fills_within, is_built, load_tokenizer, median, memory_bandwidth, model_json,
                          models_root)
from bench.sessions import turn2_ttft  # noqa: E402

NOT_BUILT = "n/a (not built)"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Row:
    key: str
    what: str
    measured: str
    ratio: float | None = None
    target: tuple[str, float] | None = None  # (">=" or "<=", value) on `checked`
    checked: float | None = None  # what the target is about: the ratio unless set

    def cells(self) -> list[str]:
        value = self.ratio if self.checked is None else self.checked
        met = ""
        if self.target and value is not None:
            op, bound = self.target
            met = "yes" if (value >= bound if op == ">=" else value <= bound) else "**no**"
        target = f"{self.target[0].replace('>=', '≥').replace('<=', '≤')} {self.target[1]:g}" if self.target else ""
        if self.key == "7d" and self.target:
            target = f"p99 {target} ms"
        ratio = "" if self.ratio is None else f"{self.ratio:.3g}"
        return [self.key, self.what, self.measured, ratio, target, met]


def markdown(rows: list[Row]) -> str:
    lines = ["| # | what | measured | ratio | target | met |", "|---|---|---|---|---|---|"]
    ordered = sorted(rows, key=lambda r: (r.key == "3", r.key))  # issue 7 (a)-(f), then issue 3
    lines += ["| " + " | ".join(r.cells()) + " |" for r in ordered]
    return "\n".join(lines)


def plain_of(directory: Path) -> Path:
    """The same build without the custom ops; else, if that is not built, also with an fp32
    embedding table (which does not change how decode speed depends on the fill)."""
    plain = directory.with_name(directory.name.removesuffix("-sdpa"))
    fp32_table = plain.with_name(plain.name.replace("-e4", ""))
    return plain if is_built(plain) or not is_built(fp32_table) else fp32_table


def label(directory: Path) -> str:
    return f"{directory.parent.name}/{directory.name}"


def bytes_per_token(directory: Path, fill: int) -> float:
    """Bytes a decode step must read from memory at context `fill`, estimated from the build:
    every weight once, except the embedding table, of which one row is read per token (the
    table is the largest tensor in these small models; a tied output projection is stored as
    its own copy in the .pte, so it stays counted), plus the K and V caches up to `fill`
    (fp32, every layer; the custom-op kernels read the filled part only). Activations are
    small and stay in cache. So: .pte size - embedding table + fill * KV bytes per position."""
    params = model_json(directory, "params.json")
    manifest = model_json(directory, "etserve.json")
    vocab, dim = params["vocab_size"], params["dim"]
    if manifest.get("embedding_quantize", "4bit" if "-e4" in directory.name else "none") == "4bit":
        table = vocab * dim / 2 + vocab * dim / 32 * 4  # int4 values + an fp32 scale per group of 32
    else:
        table = vocab * dim * 4
    kv_per_position = params["n_layers"] * 2 * params["n_kv_heads"] * params["head_dim"] * 4
    return (directory / "model.pte").stat().st_size - table + fill * kv_per_position


def decode_prompt(directory: Path, seed: str, tokens: int) -> tuple[str, list[int], dict[str, float]]:
    """A raw code prompt of about `tokens` tokens, its ids, and the logit bias that bans EOS so
    that every decode comparison generates exactly the tokens it asks for."""
    tokenizer, _ = load_tokenizer(directory)
    prompt = code_prompt(tokenizer, seed, tokens)
    bias = {str(t): -100.0 for t in model_json(directory, "etserve.json")["eos_token_ids"]}
    return prompt, tokenizer.encode(prompt), bias


def http_decode(server: Server, prompt: str, n: int, bias: dict[str, float]) -> float:
    """Decode tok/s of a streamed greedy text completion of exactly n tokens."""
    s = server.stream("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0, "logit_bias": bias})
    assert s.completion_tokens == n, s.usage
    return s.decode_tok_s


def spawn(kind: str, directory: Path, threads: int) -> Worker | str:
    """A worker loading in the background, or why it cannot."""
    try:
        return Worker(kind, directory, threads)
    except (WorkerError, OSError) as e:
        return f"{e}"


def ready(worker: Worker | str) -> Worker | str:
    """The worker once its model has loaded, or why it did not."""
    if isinstance(worker, str):
        return worker
    try:
        worker.info
        return worker
    except WorkerError as e:
        worker.close()
        return str(e)


def fill_rows(key: str, name: str, directory: Path, fills: list[int], steps: int, threads: int,
              results: dict, worker: Worker | None = None) -> Row:
    """Issue 3: decode tok/s of `directory`'s export at its smallest and largest fill, measured
    A B B A in one process (the cache is prefilled once), largest ÷ smallest."""
    if not is_built(directory):
        return Row(key, f"{name}: decode tok/s by fill", NOT_BUILT)
    ctx = model_json(directory, "etserve.json")["max_seq_len"]
    fits = fills_within(ctx, fills, steps)
    low, high = fits[0], fits[-1]
    log(f"{label(directory)}: decode at fills {low}, {high}, {high}, {low}")
    own = worker is None
    worker = worker or Worker("ours", directory, threads)
    try:
        res = worker.call("decode", fills=[low, high, high, low], steps=steps)
    finally:
        if own:
            worker.close()
    results[f"fills {label(directory)}"] = res
    rate = {f: median([r["decode_tok_s"] for r in res if r["fill"] == f]) for f in (low, high)}
    note = "" if high == fills[-1] else f" (ctx {ctx}: {fills[-1]:,} does not fit; {high} is the largest fill)"
    return Row(key, f"{name}: decode tok/s at fill {low:,} / {high:,}{note}",
               f"{rate[low]:.1f} / {rate[high]:.1f} ({steps} steps, median of 2 each)",
               rate[high] / rate[low], (">=", 0.5))


def default_section(args, bandwidth: float, results: dict) -> list[Row]:
    """Issue 7 (a)-(f) and issue 3's fill rows for the default model."""
    directory, plain = args.model_dir, args.plain_dir or plain_of(args.model_dir)
    name = label(directory)
    if not is_built(directory):
        return [Row(k, w, NOT_BUILT) for k, w in
                (("7a", "decode over HTTP ÷ bare native loop"), ("7b", "turn-2 TTFT warm ÷ cold"),
                 ("7c", "decode ÷ ExecuTorch's runner"), ("7d", "/health latency"),
                 ("7e", "server RSS ÷ .pte size"), ("7f", "decode ÷ bandwidth limit"),
                 ("3", f"{name}: decode tok/s by fill"))] + [
            fill_rows("3", f"{label(plain)} (no custom ops)", plain, args.fills, args.plain_steps, args.threads,
                      results)]
    threads, n = args.threads, args.decode_tokens
    prompt, ids, bias = decode_prompt(directory, "gamma", args.prompt_tokens)
    log(f"{name}: starting the server and the workers (prompt {len(ids)} tokens, {n} new tokens)")
    ours, runner = spawn("ours", directory, threads), spawn("runner", directory, threads)
    server = Server(directory, threads)
    rows: list[Row] = []
    try:
        ours, runner = ready(ours), ready(runner)
        if isinstance(ours, str):
            raise SystemExit(f"our runtime cannot load {directory}: {ours}")
        native, http, et_runner = [], [], []

        def run_native():
            native.append(ours.call("decode", ids=ids, fills=[len(ids)], steps=n - 1, logit_bias=bias)[0]["decode_tok_s"])

        def run_http():
            http.append(http_decode(server, prompt, n, bias))

        def run_runner():
            nonlocal runner
            if not isinstance(runner, str):
                try:
                    et_runner.append(runner.call("generate", prompt=prompt, max_new_tokens=n))
                except WorkerError as e:
                    runner.close()
                    runner = str(e)

        for r in range(args.rounds):  # A B C, C B A, A B C...: drift in the load cancels out
            order = (run_native, run_http, run_runner)
            for step in order if r % 2 == 0 else order[::-1]:
                step()
            log(f"round {r + 1}: native {native[-1]:.1f}, HTTP {http[-1]:.1f}"
                + (f", ExecuTorch runner {et_runner[-1]['decode_tok_s']:.1f}" if et_runner else "") + " tok/s")
        results.update(native_decode=native, http_decode=http, runner=et_runner)
        nat, web = median(native), median(http)
        rows.append(Row("7a", f"{name}: decode tok/s over HTTP ÷ bare native loop (fill {len(ids)}, {n} tokens)",
                        f"{web:.1f} / {nat:.1f} (median of {len(http)} each)", web / nat, (">=", 0.95)))
        if isinstance(runner, str):
            rows.append(Row("7c", f"{name}: decode tok/s over HTTP ÷ ExecuTorch's runner", f"n/a: runner: {runner}"))
        else:
            et = median([g["decode_tok_s"] for g in et_runner])
            made = sorted({g["generated_tokens"] for g in et_runner})
            rows.append(Row("7c", f"{name}: decode tok/s over HTTP ÷ ExecuTorch's runner (TextLLMRunner, "
                            f"same prompt text, {'/'.join(map(str, made))} tokens)",
                            f"{web:.1f} / {et:.1f}", web / et))
            runner.close()

        fill_row = fill_rows("3", f"{name} (custom ops)", directory, args.fills, args.steps, threads, results, ours)
        ours.close()

        log(f"{name}: turn 2 after a {args.history}-token turn 1 and a {args.other_tokens}-token other "
            "conversation, cold then warm, /health polled at 20 Hz")
        with HealthPoller(server.url) as poll:
            sessions = turn2_ttft(server, directory, args.history, args.session_repeat, args.other_tokens)
        results["sessions"] = sessions
        last = sessions["rows"][-1]
        rows.append(Row("7b", f"{name}: turn-2 time to first token, warm ÷ cold ({last['prompt_tokens']:,}-token "
                        f"prompt, {last['warm_cached']:,} cached when warm; another {args.other_tokens}-token "
                        "conversation ran between turns)",
                        f"{last['warm_ttft_s']:.2f} s / {last['cold_ttft_s']:.2f} s", sessions["ratio_median"],
                        ("<=", 0.15)))
        p50, p99 = poll.percentile_ms(50), poll.percentile_ms(99)
        results["health_ms"] = {"p50": p50, "p99": p99, "polls": len(poll.latencies), "failures": poll.failures}
        rows.append(Row("7d", "/health latency while generations stream (20 Hz during 7b)",
                        f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {1000 * max(poll.latencies):.0f} ms "
                        f"({len(poll.latencies)} polls, {sum(x > 0.05 for x in poll.latencies)} over 50 ms, "
                        f"{poll.failures} failed)",
                        target=("<=", 50), checked=p99))
        memory, size = server.worker_memory(), (directory / "model.pte").stat().st_size
        results["worker_memory"] = memory
        rows.append(Row("7e", f"{name}: gunicorn worker RSS at the end ÷ .pte size",
                        f"{memory['VmRSS'] / 2**20:,.0f} MiB (anonymous {memory['RssAnon'] / 2**20:,.0f}, "
                        f"file {memory['RssFile'] / 2**20:,.0f}) / {size / 2**20:,.0f} MiB", memory["VmRSS"] / size))
    finally:
        server.stop()
        for w in (ours, runner):
            if isinstance(w, Worker):
                w.close()
    per_token = bytes_per_token(directory, len(ids))
    limit = bandwidth / per_token
    rows.append(Row("7f", f"{name}: bare native decode tok/s ÷ bandwidth limit (fill {len(ids)})",
                    f"{nat:.1f} / {limit:.1f} ({bandwidth / 1e9:.1f} GB/s ÷ {per_token / 1e6:.0f} MB per token)",
                    nat / limit))
    rows.append(fill_row)
    rows.append(fill_rows("3", f"{label(plain)} (no custom ops)", plain, args.fills, args.plain_steps, threads,
                          results))
    return rows


def smol_section(args, results: dict) -> list[Row]:
    """Issue 3 for SmolLM2: HTTP ÷ ExecuTorch's kernels, and the fill rows of both exports."""
    directory = args.smol_dir
    plain = args.smol_plain_dir or plain_of(directory)
    name = label(directory)
    rows: list[Row] = []
    if not is_built(directory):
        rows.append(Row("3", f"{name}: decode tok/s over HTTP ÷ ExecuTorch's custom-op kernels", NOT_BUILT))
    else:
        threads, n = args.threads, args.decode_tokens
        prompt, ids, bias = decode_prompt(directory, "delta", args.prompt_tokens)
        log(f"{name}: starting the server and ExecuTorch's kernels (prompt {len(ids)} tokens, {n} new tokens)")
        et = spawn("et", directory, threads)
        server = Server(directory, threads)
        try:
            et = ready(et)
            http, kernels = [], []
            for r in range(args.rounds):  # A B, B A, A B...
                for which in ("http", "et") if r % 2 == 0 else ("et", "http"):
                    if which == "http":
                        http.append(http_decode(server, prompt, n, bias))
                    elif not isinstance(et, str):
                        kernels.append(et.call("decode", ids=ids, fills=[len(ids)], steps=n - 1)[0]["decode_tok_s"])
                log(f"round {r + 1}: HTTP {http[-1]:.1f}" + (f", ExecuTorch kernels {kernels[-1]:.1f}" if kernels else "")
                    + " tok/s")
        finally:
            server.stop()
            if isinstance(et, Worker):
                et.close()
        results.update(smol_http_decode=http, smol_et_kernels_decode=kernels)
        what = f"{name}: decode tok/s over HTTP ÷ ExecuTorch's custom-op kernels (fill {len(ids)}, {n} tokens)"
        if isinstance(et, str):
            rows.append(Row("3", what, f"n/a: ExecuTorch's kernels: {et}"))
        else:
            rows.append(Row("3", what, f"{median(http):.1f} / {median(kernels):.1f} (median of {len(http)} each)",
                            median(http) / median(kernels), (">=", 0.9)))
    rows.append(fill_rows("3", f"{name} (custom ops)", directory, args.fills, args.steps, args.threads, results))
    rows.append(fill_rows("3", f"{label(plain)} (no custom ops)", plain, args.fills, args.plain_steps, args.threads,
                          results))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=None,
                   help=f"the served model (default: the default model's build, else {models_root()}/"
                        "qwen2.5-coder-0.5b/ctx2048-8da4w-sdpa while that is not built)")
    p.add_argument("--plain-dir", type=Path, default=None, help="its export without custom ops (default: sibling)")
    p.add_argument("--smol-dir", type=Path, default=models_root() / "smollm2-135m" / "ctx512-fp32-sdpa")
    p.add_argument("--smol-plain-dir", type=Path, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt of the decode comparisons")
    p.add_argument("--decode-tokens", type=int, default=64, help="tokens each decode comparison generates")
    p.add_argument("--rounds", type=int, default=3, help="alternated repetitions of each decode comparison")
    p.add_argument("--fills", default="128,1500", help="issue 3's context fills")
    p.add_argument("--steps", type=int, default=32, help="decode steps per fill (custom-op exports)")
    p.add_argument("--plain-steps", type=int, default=12, help="decode steps per fill (exports without them)")
    p.add_argument("--history", type=int, default=1500, help="turn 1's prompt tokens in 7b")
    p.add_argument("--other-tokens", type=int, default=300,
                   help="7b: the conversation that takes the model between turns 1 and 2")
    p.add_argument("--session-repeat", type=int, default=1)
    p.add_argument("--skip-smol", action="store_true")
    p.add_argument("--json", type=Path, default=None, help="also write the raw measurements here")
    args = p.parse_args()
    args.model_dir = args.model_dir or default_model_dir()
    args.fills = [int(x) for x in args.fills.split(",")]

    started, load_start = time.monotonic(), os.getloadavg()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    log(f"load average {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}; measuring memory bandwidth")
    bandwidth = memory_bandwidth(args.threads)
    results: dict = {"bandwidth_bytes_s": bandwidth}
    rows = default_section(args, bandwidth, results)
    if not args.skip_smol:
        rows += smol_section(args, results)
    load_end = os.getloadavg()
    minutes = (time.monotonic() - started) / 60
    print(f"\n{when}, {os.cpu_count()} cores, {args.threads} runtime threads; load average at start "
          f"{load_start[0]:.2f} (5 min {load_start[1]:.2f}), at the end {load_end[0]:.2f}; "
          f"memory bandwidth (numpy copy, {args.threads} threads) {bandwidth / 1e9:.1f} GB/s; "
          f"default model {args.model_dir}; {minutes:.1f} min\n")
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
