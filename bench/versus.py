"""etserve against llama.cpp's server on the same model, side by side in one run.

Both serve Qwen2.5-Coder-0.5B at 4 bits on 127.0.0.1 with the same number of threads: etserve
its default build (8da4w: int4 weights in groups of 32, int8 dynamic activations; an 8-bit output
projection, a 4-bit embedding table, an int8 KV cache), llama.cpp the same GGUF requantized to
Q4_0 (bench/peer.py: its output projection stays Q8_0; its KV cache is f16). Both servers are up at once
and idle while the other works; requests alternate A B, B A, A B... so that a drift in the
machine's load cancels out. Every figure is what an HTTP client sees on /v1/completions,
streamed (both speak it): time to first token from sending to the first chunk carrying text,
decode rate as tokens after the first over the time between the first and the last chunk.
Decode comparisons generate exactly their tokens (etserve: EOS banned by logit_bias; llama.cpp:
`ignore_eos`); prompts measured cold are distinct per round (their first line names the round) and
llama.cpp is asked not to reuse its slot's cache (`cache_prompt: false`).

  decode               decode tok/s, ~128-token prompt, 64 tokens, median of --rounds
  prefill 1k           prompt tok/s of a cold ~1,000-token prompt (prompt tokens ÷ time to first
                       token), median of --rounds
  ttft Nk              time to first token of a cold N-thousand-token prompt, llama.cpp ÷ etserve
                       (so that above 1 is etserve faster, as in the other rows), and its average
                       prompt tok/s; 1k and 4k median of --rounds, 12k and 24k of --long-rounds
  decode at fill 12k   etserve's decode tok/s after the 12k prompt ÷ after the ~128-token one, the
                       short prompt's decode measured right after each long one (the host's speed
                       drifts between the decode row, minutes before, and the 12k prompts)
  RSS at 32k           etserve's worker VmRSS serving a 32,768-token build ÷ llama-server's at -c 32768
  RSS at same ctx      etserve's worker VmRSS ÷ llama-server's at etserve's context length, both
                       measured at the end of the same requests
  fim                  bench/fim.py (while the servers are up, after the memory was read)

Perplexity is its own table (bench/perplexity.py: each architecture's GGUF, run by
llama-perplexity, against etserve's build of that file), which bench/report.py runs after this
section.

The long rows need a build of the model holding 32,768 tokens: the default build when it does,
else its ctx32768 sibling; until one is built, they run for the lengths that fit the build there
is and say "not built" for the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bench import peer
from bench.client import Stream, stream
from bench.fim import fim_rows
from bench.models import LONG_CONTEXT, bytes_per_token, label, long_context_dir, max_seq_len, model_json
from bench.prompts import code_prompt, load_tokenizer
from bench.servers import NO_DRAFTS, EtServe, LlamaServer, ServerProcess
from bench.table import NOT_BUILT, Row, log, median

DECODE = "decode vs llama.cpp"
PREFILL_1K = "prefill 1k vs llama.cpp"
DECODE_FILL = "decode at fill 12k / 128"
RSS_32K = "RSS at 32k vs llama.cpp"
RSS_SAME = "RSS at same ctx vs llama.cpp"
LENGTHS = (1000, 4000, 12000, 24000)
FILL_LENGTH = 12000  # the prompt whose decode is measured against the short prompt's


def ttft_name(length: int) -> str:
    return f"ttft {length // 1000}k vs llama.cpp"


@dataclass
class Side:
    """One server and what it needs in a request body to generate exactly the tokens asked for."""

    name: str
    server: ServerProcess
    extra: dict
    log: list[dict] = field(default_factory=list)  # every request sent, to replay on another server

    def complete(self, prompt: str, max_tokens: int) -> Stream:
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        self.log.append(body)
        s = stream(self.server.url, "/v1/completions", {**body, **self.extra})
        if s.completion_tokens != max_tokens:
            raise RuntimeError(f"{self.name} generated {s.completion_tokens} tokens, not {max_tokens}: {s.usage}")
        return s


def alternate(rounds: int, a: Side, b: Side, measure) -> dict[str, list]:
    """measure(side, round) for A B, B A, A B...; results per side name."""
    out: dict[str, list] = {a.name: [], b.name: []}
    for r in range(rounds):
        for side in (a, b) if r % 2 == 0 else (b, a):
            out[side.name].append(measure(side, r))
    return out


def prompt_tokens(s: Stream) -> int:
    return s.prompt_tokens or 0


def server_pair(serve_dir: Path, gguf: Path, threads: int, ctx: int, bias: dict) -> tuple[Side, Side]:
    """etserve on `serve_dir` and llama-server on `gguf` (-c ctx), both started, as the two sides of
    a comparison: etserve never stops early (`bias` on its end-of-text tokens), llama.cpp ignores
    its EOS and caches no prompt. Neither drafts (llama-server's default; etserve's drafts are
    compared with llama.cpp's ngram spec types in bench/speculation.py)."""
    et_server = EtServe(serve_dir, threads, NO_DRAFTS)  # as llama-server: no speculation
    try:
        llama_server = LlamaServer(peer.program("llama-server"), gguf, threads, ctx)
    except Exception:
        et_server.stop()
        raise
    return (Side("etserve", et_server, {"logit_bias": bias}),
            Side("llama.cpp", llama_server, {"ignore_eos": True, "cache_prompt": False}))


def peer_section(args, results: dict) -> list[Row]:
    """The speed and memory rows against llama.cpp, and FIM (its own module)."""
    default_dir = args.model_dir
    long_dir = long_context_dir(default_dir)
    serve_dir = long_dir or default_dir
    ctx = max_seq_len(serve_dir)
    gguf = peer.gguf_path()
    name = label(serve_dir)
    tokenizer, _ = load_tokenizer(serve_dir)
    bias = {str(t): -100.0 for t in model_json(serve_dir, "etserve.json")["eos_token_ids"]}
    lengths = getattr(args, "lengths", LENGTHS)
    fits = [n for n in lengths if n + 64 + 64 <= ctx]
    log(f"versus llama.cpp: etserve {name} (ctx {ctx}) and llama-server -c {LONG_CONTEXT} on {gguf.name}, "
        f"{args.threads} threads each; prompt lengths {fits}")
    rows: list[Row] = []
    extra_rows: list[Row] = []  # FIM, run while both servers are up
    a, b = server_pair(serve_dir, gguf, args.threads, LONG_CONTEXT, bias)
    et_server, llama_server = a.server, b.server
    try:
        # decode, short prompt
        prompt = code_prompt(tokenizer, "decode", args.prompt_tokens)
        a.complete(prompt, 4), b.complete(prompt, 4)  # first requests pay for lazy initialization
        dec = alternate(args.rounds, a, b, lambda side, r: side.complete(prompt, args.decode_tokens))
        rate = {k: median([s.decode_tok_s for s in v]) for k, v in dec.items()}
        results["decode"] = {k: [s.decode_tok_s for s in v] for k, v in dec.items()}
        n_prompt = prompt_tokens(dec["etserve"][0])
        log(f"decode tok/s: etserve {results['decode']['etserve']}, llama.cpp {results['decode']['llama.cpp']}")
        rows.append(Row(DECODE, f"{name} vs Q4_0 GGUF: decode tok/s, drafts off on both, {n_prompt}-token prompt, "
                        f"{args.decode_tokens} tokens (median of {args.rounds})",
                        f"{rate['etserve']:.1f} / {rate['llama.cpp']:.1f}", rate["etserve"] / rate["llama.cpp"],
                        (">=", 1.1)))

        # cold prompts: 1k (prefill row and its ttft row), 4k, 12k, 24k
        ttft: dict[int, dict[str, list[Stream]]] = {}
        beside: dict[str, list[Stream]] = {a.name: [], b.name: []}  # short decodes after the 12k ones
        for length in fits:
            rounds = args.rounds if length < 10000 else args.long_rounds
            new = args.decode_tokens if length == FILL_LENGTH else 1
            log(f"cold {length}-token prompts, {rounds} round(s), {new} new token(s)")

            def cold(side: Side, r: int, length=length, new=new) -> Stream:
                s = side.complete(code_prompt(tokenizer, f"cold{length}r{r}", length), new)
                log(f"  {side.name}: {prompt_tokens(s)} prompt tokens, ttft {s.ttft:.2f} s")
                if length == FILL_LENGTH:
                    beside[side.name].append(side.complete(prompt, args.decode_tokens))
                    log(f"  {side.name}: decode {s.decode_tok_s:.1f} tok/s after it, "
                        f"{beside[side.name][-1].decode_tok_s:.1f} after the short prompt right then")
                return s

            ttft[length] = alternate(rounds, a, b, cold)
        results["ttft"] = {n: {k: [(prompt_tokens(s), s.ttft) for s in v] for k, v in d.items()} for n, d in ttft.items()}
        results["decode_after_12k"] = {k: [s.decode_tok_s for s in v] for k, v in beside.items()}

        if 1000 in ttft:
            pre = {k: median([prompt_tokens(s) / s.ttft for s in v]) for k, v in ttft[1000].items()}
            rows.append(Row(PREFILL_1K, f"prompt tok/s, cold ~1k-token prompt (prompt tokens ÷ time to first "
                            f"token, median of {args.rounds})", f"{pre['etserve']:.1f} / {pre['llama.cpp']:.1f}",
                            pre["etserve"] / pre["llama.cpp"], (">=", 1.1)))
        else:
            rows.append(Row(PREFILL_1K, "prompt tok/s, cold ~1k-token prompt", f"{NOT_BUILT} (etserve's build holds "
                            f"{ctx:,} tokens)", target=(">=", 1.1)))
        for length in LENGTHS:
            target = (">=", 1.2 if length == 12000 else 1.0)
            what = f"time to first token, cold {length:,}-token prompt, llama.cpp ÷ etserve"
            if length not in lengths:
                rows.append(Row(ttft_name(length), what, "not run (--lengths)", target=target))
                continue
            if length not in ttft:
                rows.append(Row(ttft_name(length), what, f"{NOT_BUILT} (etserve's build holds {ctx:,} tokens; "
                                f"needs a ctx{LONG_CONTEXT} build)", target=target))
                continue
            t = {k: median([s.ttft for s in v]) for k, v in ttft[length].items()}
            avg = {k: median([prompt_tokens(s) / s.ttft for s in v]) for k, v in ttft[length].items()}
            n = prompt_tokens(ttft[length]["etserve"][0])
            rows.append(Row(ttft_name(length), f"{what} ({n:,} tokens; median of {len(ttft[length]['etserve'])})",
                            f"{t['etserve']:.2f} s / {t['llama.cpp']:.2f} s; average prompt tok/s "
                            f"{avg['etserve']:.1f} / {avg['llama.cpp']:.1f}", t["llama.cpp"] / t["etserve"], target))

        what = f"decode tok/s after a {FILL_LENGTH:,}-token prompt ÷ after a {n_prompt}-token one"
        if FILL_LENGTH in ttft:
            at = {k: median([s.decode_tok_s for s in v]) for k, v in ttft[FILL_LENGTH].items()}
            then = {k: median([s.decode_tok_s for s in v]) for k, v in beside.items()}
            ratio = {k: at[k] / then[k] for k in at}
            # a step reads the weights and the filled cache: once the short step runs at the memory
            # bandwidth, no kernel does better than the ratio of the two steps' bytes
            half = args.decode_tokens // 2
            n_long = prompt_tokens(ttft[FILL_LENGTH]["etserve"][0])
            short, long = (bytes_per_token(serve_dir, n + half) for n in (n_prompt, n_long))
            rows.append(Row(DECODE_FILL, f"etserve: {what} ({args.decode_tokens} tokens, the short prompt's "
                            "right after each long one; llama.cpp for reference; the bound: the short step's bytes "
                            "÷ the long one's, what a step reading at the memory bandwidth allows)",
                            f"{at['etserve']:.1f} / {then['etserve']:.1f} (llama.cpp {at['llama.cpp']:.1f} / "
                            f"{then['llama.cpp']:.1f} = {ratio['llama.cpp']:.2f}; bound {short / 1e6:.0f} MB / "
                            f"{long / 1e6:.0f} MB = {short / long:.3f}; the short step read "
                            f"{then['etserve'] * short / 1e9:.1f} GB/s; {rate['etserve']:.1f} tok/s in the decode "
                            "row)", ratio["etserve"], (">=", 0.8)))
        elif FILL_LENGTH not in lengths:
            rows.append(Row(DECODE_FILL, f"etserve: {what}", "not run (--lengths)", target=(">=", 0.8)))
        else:
            rows.append(Row(DECODE_FILL, f"etserve: {what}", f"{NOT_BUILT} (needs a ctx{LONG_CONTEXT} build)",
                            target=(">=", 0.8)))

        # memory at the end of the same requests
        mem_et, mem_llama = et_server.memory(), llama_server.memory()
        results["rss"] = {"etserve": mem_et, f"llama.cpp -c {LONG_CONTEXT}": mem_llama}
        log(f"VmRSS: etserve {mem_et['VmRSS'] / 2**20:.0f} MiB, llama.cpp {mem_llama['VmRSS'] / 2**20:.0f} MiB")
        if not args.skip_fim:
            extra_rows += fim_rows({"etserve": et_server.url, "llama.cpp": llama_server.url}, results, args.fim_cases)
    finally:
        et_server.stop()
        llama_server.stop()

    def mib(m: dict) -> str:
        return f"{m['VmRSS'] / 2**20:,.0f} MiB (anon {m['RssAnon'] / 2**20:,.0f})"

    what = f"worker VmRSS at the end of these requests ÷ llama-server's at -c {LONG_CONTEXT}"
    if ctx >= LONG_CONTEXT:
        rows.append(Row(RSS_32K, f"{what}, etserve's build holding {ctx:,}", f"{mib(mem_et)} / {mib(mem_llama)}",
                        mem_et["VmRSS"] / mem_llama["VmRSS"], ("<=", 1.0)))
        same = mem_llama
    else:
        rows.append(Row(RSS_32K, what, f"{NOT_BUILT} (etserve's build holds {ctx:,} tokens)", target=("<=", 1.0)))
        log(f"llama-server -c {ctx}: replaying the same {len(b.log)} requests for its memory")
        with LlamaServer(peer.program("llama-server"), gguf, args.threads, ctx) as small:
            replay = Side("llama.cpp", small, b.extra)
            for body in b.log:
                replay.complete(body["prompt"], body["max_tokens"])
            same = small.memory()
        results["rss"][f"llama.cpp -c {ctx}"] = same
    rows.append(Row(RSS_SAME, f"worker VmRSS ÷ llama-server's, both at {ctx:,} positions, at the end of the same "
                    "requests", f"{mib(mem_et)} / {mib(same)}", mem_et["VmRSS"] / same["VmRSS"], ("<=", 0.9)))
    return rows + extra_rows


def peer_ready(build: bool) -> str | None:
    """None when the peer and its GGUF are there (building them first if allowed), else why not."""
    if not peer.is_built():
        if not build:
            return f"llama.cpp not built ({peer.bin_dir()}): make bench-peer"
        log("llama.cpp's server is not built: building it once (bench/peer.py, ~20 min on 2 cores)")
        peer.build()
    if not peer.gguf_path().is_file():
        log("making the Q4_0 GGUF (llama-quantize)")
        peer.make_gguf()
    return None


def rows_not_run(why: str) -> list[Row]:
    from bench import fim

    names = [DECODE, PREFILL_1K, *(ttft_name(n) for n in LENGTHS), DECODE_FILL, RSS_32K, RSS_SAME, fim.NAME]
    return [Row(n, "etserve vs llama.cpp", f"n/a: {why}") for n in names]
