"""etserve measured against its own parts, side by side in one run: the server's overhead over a
bare native decode loop, ExecuTorch's own runner and kernels on the same .pte, saved sessions,
/health while generating, the worker's memory, the memory-bandwidth limit, and decode speed as
the context fills (with and without ExecuTorch's LLM custom ops).

  http overhead        decode tok/s streamed over HTTP (/v1/completions, greedy, EOS banned by
                       logit_bias so every run decodes the same number of tokens) ÷ decode tok/s
                       of the same .pte, prompt and sampling driven by a bare native loop
                       (bench/runtimes.py `ours`, NativeModel in its own process)
  session restore      turn-2 time to first token of a conversation with a --history token first
                       turn, after another conversation took the model: warm (its session
                       restored) ÷ cold (bench/sessions.py)
  vs ExecuTorch runner the HTTP decode rate ÷ ExecuTorch's own runner (TextLLMRunner) on the
                       same .pte, prompt text and number of new tokens
  health latency       /health p50 / p99, polled at 20 Hz while the session turns stream
  worker RSS / .pte    the gunicorn worker's VmRSS at the end ÷ the .pte's size
  bandwidth use        the bare native decode rate ÷ the memory-bandwidth limit (bytes_per_token)
  decode by fill       decode tok/s at the largest ÷ the smallest fill, with the custom ops and
                       without (bench/runtimes.py `ours`)
  vs ExecuTorch kernels SmolLM2 decode tok/s over HTTP ÷ ExecuTorch's own custom-op kernels
                       (bench/runtimes.py `et`, the wheel's pybinding) on the same .pte
  decode at fill 12k   decode tok/s at a 12,000-token fill ÷ at 128 in the bare native loop
                       (bench/runtimes.py `ours`; fills alternated 128, 12k, 12k, 128, then
                       12k, 128, 128, 12k...), naming the CPU tier whose kernels ran (the host's
                       best, or a lower one forced by ETSERVE_ISA, e.g. avx2 on an AVX-512 host),
                       the int8-KV attention kernel and the host; the bound is the short step's
                       bytes ÷ the long one's (a step reading at the memory bandwidth). On a host
                       above AVX2 a second row, "(AVX2 tier)", measures the same in a worker
                       whose CPUID is masked to AVX2 (ETSERVE_CPU_MASK=avx2: XNNPACK's kernels
                       too), the tier an older box runs
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.client import HealthPoller, stream
from bench.machine import cpu_model, cpu_tier
from bench.models import bytes_per_token, is_built, label, model_json, plain_of
from bench.prompts import code_prompt, load_tokenizer
from bench.decoding import fills_within
from bench.servers import NO_DRAFTS, EtServe
from bench.sessions import turn2_ttft
from bench.table import NOT_BUILT, Row, log, median
from bench.workers import Worker, WorkerError, ready, spawn

HTTP_OVERHEAD = "http overhead"
# The session-restore row's server: one sequence slot, so that another conversation does take the
# model (with several, a finished conversation keeps its slot and its "cold" turn is warm)
ONE_SLOT = {**NO_DRAFTS, "ETSERVE_PARALLEL": "1"}
SESSION_RESTORE = "session restore"
VS_RUNNER = "vs ExecuTorch runner"
HEALTH = "health latency"
RSS_VS_PTE = "worker RSS / .pte"
BANDWIDTH = "bandwidth use"
FILL_CUSTOM = "decode by fill (custom ops)"
FILL_PORTABLE = "decode by fill (portable ops)"
VS_ET_KERNELS = "vs ExecuTorch kernels"
FILL_12K = "decode at fill 12k (tier)"
# The same on a host above AVX2, its CPUID masked to AVX2 (libcpu_mask.so): the tier an older
# box runs, measured wherever the bench runs
FILL_12K_AVX2 = "decode at fill 12k (AVX2 tier)"
LONG_FILL = 12000


def decode_prompt(directory: Path, seed: str, tokens: int) -> tuple[str, list[int], dict[str, float]]:
    """A raw code prompt of about `tokens` tokens, its ids, and the logit bias that bans EOS so
    that every decode comparison generates exactly the tokens it asks for."""
    tokenizer, _ = load_tokenizer(directory)
    prompt = code_prompt(tokenizer, seed, tokens)
    bias = {str(t): -100.0 for t in model_json(directory, "etserve.json")["eos_token_ids"]}
    return prompt, tokenizer.encode(prompt), bias


def http_decode(server: EtServe, prompt: str, n: int, bias: dict[str, float]) -> float:
    """Decode tok/s of a streamed greedy text completion of exactly n tokens."""
    s = stream(server.url, "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0, "logit_bias": bias})
    assert s.completion_tokens == n, s.usage
    return s.decode_tok_s


def fill_rows(key: str, name: str, directory: Path, fills: list[int], steps: int, threads: int,
              results: dict, worker: Worker | None = None) -> Row:
    """Decode tok/s of `directory`'s export at its smallest and largest fill, measured
    A B B A in one process (the cache is prefilled once), largest ÷ smallest."""
    if not is_built(directory):
        return Row(key, f"{name}: decode tok/s by fill", NOT_BUILT)
    ctx = model_json(directory, "etserve.json")["max_seq_len"]
    fits = fills_within(ctx, fills, steps)
    low, high = fits[0], fits[-1]
    log(f"{label(directory)}: decode at fills {low}, {high}, {high}, {low}")
    owned = worker is None
    worker = worker or Worker("ours", directory, threads)
    try:
        res = worker.call("decode", fills=[low, high, high, low], steps=steps)
    finally:
        if owned:
            worker.close()
    results[f"fills {label(directory)}"] = res
    rate = {f: median([r["decode_tok_s"] for r in res if r["fill"] == f]) for f in (low, high)}
    note = "" if high == fills[-1] else f" (ctx {ctx}: {fills[-1]:,} does not fit; {high} is the largest fill)"
    return Row(key, f"{name}: decode tok/s at fill {low:,} / {high:,}{note}",
               f"{rate[low]:.1f} / {rate[high]:.1f} ({steps} steps, median of 2 each)",
               rate[high] / rate[low], (">=", 0.5))


def tier_note(info: dict) -> str:
    """The kernels a worker ran and the host: "avx2 kernels (ETSERVE_ISA=avx2 on a host with AMX +
    AVX-512 VNNI + ...), int8-KV attention: ..., on <CPU>"; with ETSERVE_CPU_MASK, that mask."""
    forced, mask = info.get("forced_isa"), info.get("cpu_mask")
    host = f"{cpu_model()}, {os.cpu_count()} cores, tier {cpu_tier()}"
    where = f"ETSERVE_ISA={forced} on {host}" if forced else host
    if mask:  # libcpu_mask.so: the whole process saw the smaller CPU
        where = f"CPUID masked to {mask} for the whole process (XNNPACK's kernels too) on {where}"
    return f"{info.get('isa', '?')} kernels, int8-KV attention: {info.get('attention', '?')}; host: {where}"


def avx2_row_wanted() -> bool:
    """Whether to add FILL_12K_AVX2: the CPU has an x86 tier above AVX2 (AVX-512, AMX) and the
    bench is not masked already (then FILL_12K is that row; /proc/cpuinfo, which cpu_tier reads,
    names the host's tier all the same)."""
    tier = cpu_tier()
    return ("AVX-512" in tier or "AMX" in tier) and not os.environ.get("ETSERVE_CPU_MASK")


def fill_12k_row(directory: Path, steps: int, threads: int, rounds: int, results: dict,
                 worker: Worker | None = None, cpu_mask: str | None = None) -> Row:
    """Decode tok/s at a 12,000-token fill ÷ at 128 in the bare native loop, the fills alternated
    within one process (the cache prefilled once), the row naming the kernels' tier and the host;
    with cpu_mask ("avx2"), in a worker whose CPUID is masked to it (FILL_12K_AVX2)."""
    key = FILL_12K_AVX2 if cpu_mask == "avx2" else FILL_12K
    what = f"{label(directory)}: decode tok/s at fill {LONG_FILL:,} ÷ fill 128, bare native loop"
    if not is_built(directory):
        return Row(key, what, NOT_BUILT)
    ctx = model_json(directory, "etserve.json")["max_seq_len"]
    if ctx < LONG_FILL + steps + 1:
        return Row(key, what, f"{NOT_BUILT} (ctx {ctx}: needs a build holding {LONG_FILL + steps + 1:,} tokens)")
    owned = worker is None
    worker = worker or Worker("ours", directory, threads, cpu_mask)
    try:
        note = tier_note(worker.info)
        log(f"{label(directory)}: decode at fills 128 and {LONG_FILL} ({note})")
        # one call: the cache is prefilled to 12k once (decode_fills), then the fills alternate
        order = [f for r in range(rounds) for f in ((128, LONG_FILL, LONG_FILL, 128) if r % 2 == 0
                                                    else (LONG_FILL, 128, 128, LONG_FILL))]
        res = worker.call("decode", fills=order, steps=steps)
        for r in range(rounds):
            log(f"round {r + 1}: " + ", ".join(f"{x['fill']}: {x['decode_tok_s']:.1f}" for x in res[4 * r:4 * r + 4])
                + " tok/s")
    finally:
        if owned:
            worker.close()
    results["fill_12k" + (f"_{cpu_mask}" if cpu_mask else "")] = {"tier": note, "decode": res}
    rate = {f: median([x["decode_tok_s"] for x in res if x["fill"] == f]) for f in (128, LONG_FILL)}
    cpu = {f: median([x["decode_tok_cpu_s"] for x in res if x["fill"] == f]) for f in (128, LONG_FILL)}
    half = steps // 2
    short, long = (bytes_per_token(directory, n + half) for n in (128, LONG_FILL))
    return Row(key, f"{what} ({note}; {steps} steps, median of {2 * rounds} each; the bound: the short step's "
               "bytes ÷ the long one's; per CPU-second: tokens per second of the process's CPU time, which a "
               "busy host's time slicing does not stretch)",
               f"{rate[LONG_FILL]:.1f} / {rate[128]:.1f} (bound {short / 1e6:.0f} MB / {long / 1e6:.0f} MB = "
               f"{short / long:.3f}; per CPU-second {cpu[LONG_FILL]:.2f} / {cpu[128]:.2f} = "
               f"{cpu[LONG_FILL] / cpu[128]:.3f})", rate[LONG_FILL] / rate[128], (">=", 0.75))


def default_section(args, bandwidth: float, results: dict) -> list[Row]:
    """etserve against its own parts on the default model: the HTTP layer, ExecuTorch's runner,
    saved sessions, /health under load, memory, bandwidth, and decode speed by fill."""
    directory, plain = args.model_dir, args.plain_dir or plain_of(args.model_dir)
    name = label(directory)
    if not is_built(directory):
        return [Row(k, w, NOT_BUILT) for k, w in
                ((HTTP_OVERHEAD, "decode over HTTP ÷ bare native loop"), (SESSION_RESTORE, "turn-2 TTFT warm ÷ cold"),
                 (VS_RUNNER, "decode ÷ ExecuTorch's runner"), (HEALTH, "/health latency"),
                 (RSS_VS_PTE, "server RSS ÷ .pte size"), (BANDWIDTH, "decode ÷ bandwidth limit"),
                 (FILL_CUSTOM, f"{name}: decode tok/s by fill"),
                 (FILL_12K, f"{name}: decode tok/s at fill {LONG_FILL:,} ÷ fill 128"))] + [
            fill_rows(FILL_PORTABLE, f"{label(plain)} (no custom ops)", plain, args.fills, args.plain_steps, args.threads,
                      results)]
    threads, n = args.threads, args.decode_tokens
    prompt, ids, bias = decode_prompt(directory, "gamma", args.prompt_tokens)
    log(f"{name}: starting the server and the workers (prompt {len(ids)} tokens, {n} new tokens)")
    ours, runner = spawn("ours", directory, threads), spawn("runner", directory, threads)
    server = EtServe(directory, threads, ONE_SLOT)
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
        rows.append(Row(HTTP_OVERHEAD, f"{name}: decode tok/s over HTTP (drafts off) ÷ bare native loop (fill {len(ids)}, {n} tokens)",
                        f"{web:.1f} / {nat:.1f} (median of {len(http)} each)", web / nat, (">=", 0.95)))
        if isinstance(runner, str):
            rows.append(Row(VS_RUNNER, f"{name}: decode tok/s over HTTP ÷ ExecuTorch's runner", f"n/a: runner: {runner}"))
        else:
            et = median([g["decode_tok_s"] for g in et_runner])
            made = sorted({g["generated_tokens"] for g in et_runner})
            rows.append(Row(VS_RUNNER, f"{name}: decode tok/s over HTTP ÷ ExecuTorch's runner (TextLLMRunner, "
                            f"same prompt text, {'/'.join(map(str, made))} tokens)",
                            f"{web:.1f} / {et:.1f}", web / et))
            runner.close()

        fill_row = fill_rows(FILL_CUSTOM, f"{name} (custom ops)", directory, args.fills, args.steps, threads, results, ours)
        long_row = fill_12k_row(directory, args.steps, threads, args.long_rounds, results, ours)
        ours.close()

        log(f"{name}: turn 2 after a {args.history}-token turn 1 and a {args.other_tokens}-token other "
            "conversation, cold then warm, /health polled at 20 Hz")
        with HealthPoller(server.url) as poll:
            sessions = turn2_ttft(server, directory, args.history, args.session_repeat, args.other_tokens)
        results["sessions"] = sessions
        last = sessions["rows"][-1]
        rows.append(Row(SESSION_RESTORE, f"{name}: turn-2 time to first token, warm ÷ cold ({last['prompt_tokens']:,}-token "
                        f"prompt, {last['warm_cached']:,} cached when warm; another {args.other_tokens}-token "
                        "conversation ran between turns)",
                        f"{last['warm_ttft_s']:.2f} s / {last['cold_ttft_s']:.2f} s", sessions["ratio_median"],
                        ("<=", 0.15)))
        p50, p99 = poll.percentile_ms(50), poll.percentile_ms(99)
        results["health_ms"] = {"p50": p50, "p99": p99, "polls": len(poll.latencies), "failures": poll.failures}
        rows.append(Row(HEALTH, "/health latency while generations stream (20 Hz during the session-restore turns)",
                        f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {1000 * max(poll.latencies):.0f} ms "
                        f"({len(poll.latencies)} polls, {sum(x > 0.05 for x in poll.latencies)} over 50 ms, "
                        f"{poll.failures} failed)",
                        target=("<=", 50), checked=p99, unit="ms (p99)"))
        memory, size = server.memory(), (directory / "model.pte").stat().st_size
        results["worker_memory"] = memory
        rows.append(Row(RSS_VS_PTE, f"{name}: gunicorn worker RSS at the end ÷ .pte size",
                        f"{memory['VmRSS'] / 2**20:,.0f} MiB (anonymous {memory['RssAnon'] / 2**20:,.0f}, "
                        f"file {memory['RssFile'] / 2**20:,.0f}) / {size / 2**20:,.0f} MiB", memory["VmRSS"] / size))
    finally:
        server.stop()
        for w in (ours, runner):
            if isinstance(w, Worker):
                w.close()
    per_token = bytes_per_token(directory, len(ids))
    limit = bandwidth / per_token
    rows.append(Row(BANDWIDTH, f"{name}: bare native decode tok/s ÷ bandwidth limit (fill {len(ids)})",
                    f"{nat:.1f} / {limit:.1f} ({bandwidth / 1e9:.1f} GB/s ÷ {per_token / 1e6:.0f} MB per token)",
                    nat / limit))
    rows.append(fill_row)
    rows.append(long_row)
    if avx2_row_wanted():
        rows.append(fill_12k_row(directory, args.steps, threads, args.long_rounds, results, cpu_mask="avx2"))
    rows.append(fill_rows(FILL_PORTABLE, f"{label(plain)} (no custom ops)", plain, args.fills, args.plain_steps, threads,
                          results))
    return rows


def smol_section(args, results: dict) -> list[Row]:
    """SmolLM2 (the test model): decode over HTTP ÷ ExecuTorch's kernels, and the fill rows of
    both exports."""
    directory = args.smol_dir
    plain = args.smol_plain_dir or plain_of(directory)
    name = label(directory)
    rows: list[Row] = []
    if not is_built(directory):
        rows.append(Row(VS_ET_KERNELS, f"{name}: decode tok/s over HTTP ÷ ExecuTorch's custom-op kernels", NOT_BUILT))
    else:
        threads, n = args.threads, args.decode_tokens
        prompt, ids, bias = decode_prompt(directory, "delta", args.prompt_tokens)
        log(f"{name}: starting the server and ExecuTorch's kernels (prompt {len(ids)} tokens, {n} new tokens)")
        et = spawn("et", directory, threads)
        server = EtServe(directory, threads, NO_DRAFTS)
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
            rows.append(Row(VS_ET_KERNELS, what, f"n/a: ExecuTorch's kernels: {et}"))
        else:
            rows.append(Row(VS_ET_KERNELS, what, f"{median(http):.1f} / {median(kernels):.1f} (median of {len(http)} each)",
                            median(http) / median(kernels), (">=", 0.9)))
    rows.append(fill_rows(FILL_CUSTOM, f"{name} (custom ops)", directory, args.fills, args.steps, args.threads, results))
    rows.append(fill_rows(FILL_PORTABLE, f"{label(plain)} (no custom ops)", plain, args.fills, args.plain_steps, args.threads,
                          results))
    return rows
