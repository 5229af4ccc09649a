"""A shared box: several clients at once, etserve against llama.cpp's server, side by side.

Both serve the default model on 127.0.0.1 with the same threads, each with its default slots
(etserve --parallel 4; llama-server without -np: its default, several slots over one unified
cache). Every agent prompt is new to both servers (its first line names the run and round), so
neither reuses a cache.

  infill during agent      an editor's /infill (a ~60-line file around the cursor, 32 tokens)
                           sent while an agent-sized request (a ~12k-token prompt, up to 256
                           tokens out) is being read: the infill's latency, etserve's in seconds
                           (target <= 2 s) and llama.cpp's ÷ etserve's (target >= 1 / 0.3)
  agent with infill        the agent request's total time with the infill beside it ÷ alone
                           (etserve; target <= 1.15)
  4 chats aggregate        four concurrent chat streams (short prompts, 200 tokens each):
                           aggregate tok/s ÷ one stream alone (target >= 1.5), and etserve's
                           aggregate ÷ llama.cpp's (target >= 1.0)
  RSS, default slots       worker VmRSS at the end of these requests (a 12k prompt served) ÷
                           llama-server's at -c 32768 with its default slots (target <= 1.0)
"""

from __future__ import annotations

import threading
import time

import requests

from bench import peer
from bench.client import stream
from bench.models import LONG_CONTEXT, label, long_context_dir, max_seq_len, model_json
from bench.prompts import code_prompt, load_tokenizer, source_text
from bench.servers import EtServe, LlamaServer
from bench.table import Row, log, median

INFILL = "infill during agent vs llama.cpp"
AGENT = "agent with infill / alone"
CHATS = "4 chats aggregate"
CHATS_PEER = "4 chats aggregate vs llama.cpp"
RSS = "RSS, default slots vs llama.cpp"
AGENT_TOKENS = 12000
AGENT_OUT = 256
CHAT_TOKENS = 200


def _infill_body(r: int) -> dict:
    code = source_text(f"editor{r}", 15)  # a 60-line file
    cut = code.index("    return", len(code) // 2)
    return {"input_prefix": code[:cut] + "    ", "input_suffix": code[cut:].split("\n", 1)[1],
            "n_predict": 32, "temperature": 0, "cache_prompt": True}


def _post_infill(url: str, body: dict) -> float:
    t0 = time.perf_counter()
    r = requests.post(url + "/infill", json=body, timeout=3600)
    if not r.ok:
        raise RuntimeError(f"{url}/infill: {r.status_code} {r.text[:300]}")
    return time.perf_counter() - t0


def _agent(url: str, prompt: str, extra: dict) -> dict:
    t0 = time.perf_counter()
    s = stream(url, "/v1/completions", {"prompt": prompt, "max_tokens": AGENT_OUT, "temperature": 0, **extra})
    return {"total": time.perf_counter() - t0, "ttft": s.ttft, "tokens": s.completion_tokens}


def _agent_with_infill(url: str, prompt: str, extra: dict, infill: dict, delay: float) -> tuple[dict, float]:
    """The agent request, and an infill sent `delay` seconds after it (while its prompt is read)."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(_agent(url, prompt, extra)))
    t.start()
    time.sleep(delay)
    latency = _post_infill(url, infill)
    t.join()
    return out, latency


def _chats(url: str, n: int, seed: str, extra: dict) -> float:
    """Aggregate decode tok/s of n concurrent chat streams of CHAT_TOKENS tokens each."""
    results = [None] * n

    def one(i):
        results[i] = stream(url, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": f"{seed} {i}: write a long story about a lighthouse."}],
            "max_tokens": CHAT_TOKENS, "temperature": 0, **extra})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = min(s.first for s in results)
    last = max(s.last for s in results)
    return sum(s.completion_tokens for s in results) / (last - first)


def sharing_rows(args, results: dict) -> list[Row]:
    default_dir = args.model_dir
    serve_dir = long_context_dir(default_dir) or default_dir
    if max_seq_len(serve_dir) < AGENT_TOKENS + AGENT_OUT + 64:
        return [Row(n, "a shared box", "not built (needs a ctx32768 build)") for n in (INFILL, AGENT, CHATS, RSS)]
    tokenizer, _ = load_tokenizer(serve_dir)
    gguf = peer.gguf_path()
    no_eos = {"logit_bias": {str(t): -100.0 for t in model_json(serve_dir, "etserve.json")["eos_token_ids"]}}
    et = EtServe(serve_dir, args.threads)
    try:
        llama = LlamaServer(peer.program("llama-server"), gguf, args.threads, LONG_CONTEXT, parallel=None)
    except Exception:
        et.stop()
        raise
    sides = {"etserve": (et, no_eos), "llama.cpp": (llama, {"ignore_eos": True})}  # exactly the tokens asked
    nonce = time.strftime("%H%M%S")
    rows: list[Row] = []
    try:
        log(f"shared box: etserve {label(serve_dir)} (--parallel default) and llama-server (default slots)")
        for url in (et.url, llama.url):  # first requests pay for lazy initialization
            _post_infill(url, _infill_body(-1))
        # rows 1 and 2: the agent alone (etserve), then with an infill beside it (both), alternated
        alone, together, infill = [], {"etserve": [], "llama.cpp": []}, {"etserve": [], "llama.cpp": []}
        rounds = max(1, args.long_rounds)
        for r in range(rounds):
            prompt = code_prompt(tokenizer, f"agent{nonce}a{r}", AGENT_TOKENS)
            a = _agent(et.url, prompt, no_eos)
            alone.append(a)
            log(f"  etserve agent alone: {a['total']:.1f} s ({a['tokens']} tokens)")
            order = ("etserve", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "etserve")
            for name in order:
                server, extra = sides[name]
                prompt = code_prompt(tokenizer, f"agent{nonce}{name[0]}{r}", AGENT_TOKENS)
                out, latency = _agent_with_infill(server.url, prompt, extra, _infill_body(r), delay=3.0)
                together[name].append(out)
                infill[name].append(latency)
                log(f"  {name}: infill {latency:.2f} s during the agent's request ({out['total']:.1f} s)")
        lat = {k: median(v) for k, v in infill.items()}
        results["sharing_infill_s"] = infill
        rows.append(Row(INFILL, f"an editor's 32-token /infill sent 3 s into a cold {AGENT_TOKENS:,}-token agent "
                        f"request: latency, llama.cpp ÷ etserve (median of {rounds}); target: etserve <= 2 s and "
                        "<= 0.3x llama.cpp", f"{lat['etserve']:.2f} s / {lat['llama.cpp']:.2f} s",
                        lat["llama.cpp"] / lat["etserve"], (">=", 1 / 0.3)))
        rows.append(Row(INFILL + " (s)", "the same infill's latency on etserve, seconds", f"{lat['etserve']:.2f} s",
                        None, ("<=", 2.0), checked=lat["etserve"], unit="s"))
        t_alone = median([a["total"] for a in alone])
        t_with = median([a["total"] for a in together["etserve"]])
        results["sharing_agent_s"] = {"alone": alone, "with_infill": together}
        rows.append(Row(AGENT, f"etserve: the agent request's total time with the infill beside it ÷ alone "
                        f"(median of {rounds})", f"{t_with:.1f} s / {t_alone:.1f} s", t_with / t_alone, ("<=", 1.15)))

        # row 3: four chats at once
        single, four = {}, {}
        for name in ("etserve", "llama.cpp"):
            server, extra = sides[name]
            single[name] = _chats(server.url, 1, f"solo{nonce}", extra)
            four[name] = _chats(server.url, 4, f"four{nonce}", extra)
            log(f"  {name}: one stream {single[name]:.1f} tok/s, four at once {four[name]:.1f} tok/s together")
        results["sharing_chats_tok_s"] = {"single": single, "four": four}
        rows.append(Row(CHATS, f"etserve: four concurrent chat streams ({CHAT_TOKENS} tokens each), aggregate "
                        "tok/s ÷ one stream alone", f"{four['etserve']:.1f} / {single['etserve']:.1f}",
                        four["etserve"] / single["etserve"], (">=", 1.5)))
        rows.append(Row(CHATS_PEER, "the same four streams' aggregate tok/s, etserve ÷ llama.cpp (default slots)",
                        f"{four['etserve']:.1f} / {four['llama.cpp']:.1f}", four["etserve"] / four["llama.cpp"],
                        (">=", 1.0)))

        # row 6: memory at the end of the same requests
        mem_et, mem_llama = et.memory(), llama.memory()
        results["sharing_rss"] = {"etserve": mem_et, "llama.cpp": mem_llama}
        rows.append(Row(RSS, f"worker VmRSS with the default slots after the {AGENT_TOKENS:,}-token requests ÷ "
                        f"llama-server's at -c {LONG_CONTEXT} with its default slots",
                        f"{mem_et['VmRSS'] / 2**20:,.0f} MiB / {mem_llama['VmRSS'] / 2**20:,.0f} MiB",
                        mem_et["VmRSS"] / mem_llama["VmRSS"], ("<=", 1.0)))
    finally:
        et.stop()
        llama.stop()
    return rows
