"""Perplexity of etserve's build and of llama.cpp's Q4_0 GGUF on the same held-out text, scored
the same way, as one row.

The text is bench/data/coriolanus.txt (the opening of Shakespeare's Coriolanus, public domain;
see bench/data/README.md). Both sides score the same token ids: llama.cpp's tokenization of the
text (llama-server's /tokenize with the model's special tokens, which is what llama-perplexity
feeds itself), checked against etserve's own tokenizer (the row says if they differ).

  llama.cpp  llama-perplexity -f TEXT -c 512 on the GGUF, its own windows: the text cut into
             512-token windows, each from an empty cache, the second half of each scored
  etserve    the same windows and scored positions through our runtime (bench/runtimes.py
             `perplexity`): the native model returns the logits of a forward call's last
             position only, so each scored position is one forward of one token after the
             window's first half is prefilled. Exact (full-vocabulary log-softmax of the model's
             own logits at every scored position), one decode step per scored token.

Ratio: etserve's perplexity ÷ llama.cpp's (target ≤ 1.0).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import requests

from bench import peer
from bench.models import label
from bench.prompts import load_tokenizer
from bench.table import Row, log
from bench.workers import Worker

TEXT = Path(__file__).resolve().parent / "data" / "coriolanus.txt"
N_CTX = 512
NAME = "perplexity vs llama.cpp"


def llama_tokens(url: str) -> tuple[list[int], int | None]:
    """llama.cpp's token ids for TEXT as llama-perplexity makes them (from the llama-server at
    `url`), and the BOS id it puts at the start of each window (None when the model adds none)."""
    def tokenize(special: bool) -> list[int]:
        r = requests.post(url + "/tokenize", json={"content": TEXT.read_text(), "add_special": special}, timeout=60)
        r.raise_for_status()
        return r.json()["tokens"]

    with_special, plain = tokenize(True), tokenize(False)
    bos = with_special[0] if len(with_special) == len(plain) + 1 else None
    return with_special, bos


def llama_perplexity(threads: int) -> float:
    out = subprocess.run([str(peer.program("llama-perplexity")), "-m", str(peer.gguf_path()), "-f", str(TEXT),
                          "-c", str(N_CTX), "-t", str(threads), "-tb", str(threads)],
                         capture_output=True, text=True, check=True)
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
    if not found:
        raise RuntimeError("llama-perplexity printed no final estimate: " + (out.stdout + out.stderr)[-800:])
    return float(found.group(1))


def perplexity_rows(model_dir: Path, llama_url: str, threads: int, results: dict) -> list[Row]:
    log(f"perplexity on {TEXT.name}: llama.cpp's tokens, then llama-perplexity -c {N_CTX}")
    ids, bos = llama_tokens(llama_url)
    tokenizer, _ = load_tokenizer(model_dir)
    ours_ids = tokenizer.encode(TEXT.read_text())
    same = ours_ids == ids[1:] if bos is not None else ours_ids == ids
    theirs = llama_perplexity(threads)
    log(f"llama.cpp: {theirs:.4f}; etserve {label(model_dir)} over the same {len(ids)} tokens")
    with Worker("ours", model_dir, threads) as worker:
        mine = worker.call("perplexity", ids=ids, n_ctx=N_CTX, bos=bos)
    results["perplexity"] = {"etserve": mine, "llama.cpp": theirs, "tokens": len(ids), "bos": bos,
                             "same_tokenization": same}
    log(f"etserve: {mine['ppl']:.4f} over {mine['count']} scored tokens")
    note = "" if same else "; **etserve's tokenizer splits the text differently** (llama.cpp's ids used for both)"
    return [Row(NAME, f"{label(model_dir)} vs Q4_0 GGUF: perplexity on {TEXT.name} ({len(ids):,} tokens, "
                f"{mine['windows']} windows of {N_CTX}, {mine['count']:,} scored as llama-perplexity scores them)"
                + note, f"{mine['ppl']:.3f} / {theirs:.3f}", mine["ppl"] / theirs, ("<=", 1.0))]
