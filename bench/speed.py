"""Prefill and decode speed of built models through our native runtime, side by side.

    python bench/speed.py [MODEL_DIR ...] [--threads 2] [--prefill 128] [--fills 128,400] [--decode 32]

With no MODEL_DIR, every complete build under the model cache is measured.
Decode speed is measured at each context fill (tokens already in the KV cache)
so the cost of a longer context shows as a ratio against the first fill.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine import NativeModel, SamplingParams, set_num_threads  # noqa: E402
from app.models.registry import cache_root  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)


def built_models() -> list[Path]:
    return sorted(p.parent for p in (cache_root() / "models").glob("*/*/etserve.json"))


def filler(n: int, vocab: int) -> list[int]:
    """Deterministic ordinary token ids (no specials at the bottom of the vocabulary)."""
    return [1000 + (i * 7919) % (min(vocab, 30000) - 1000) for i in range(n)]


def prefill_rate(model: NativeModel, n: int, chunk: int) -> float:
    ids = filler(n, model.info.vocab_size)
    t0 = time.perf_counter()
    for pos in range(0, n, chunk):
        model.forward(ids[pos:pos + chunk], pos)
    return n / (time.perf_counter() - t0)


def decode_rate(model: NativeModel, fill: int, steps: int, chunk: int) -> float:
    ids = filler(fill, model.info.vocab_size)
    for pos in range(0, fill, chunk):
        model.forward(ids[pos:pos + chunk], pos)
    token, _, rng = model.sample(GREEDY, 0)
    t0 = time.perf_counter()
    for i in range(steps):
        model.forward([token], fill + i)
        token, _, rng = model.sample(GREEDY, rng)
    return steps / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", type=Path)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefill", type=int, default=128)
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--fills", default="128,400")
    p.add_argument("--decode", type=int, default=32)
    args = p.parse_args()
    set_num_threads(args.threads)
    fills = [int(x) for x in args.fills.split(",")]
    rows = []
    for directory in args.models or built_models():
        model = NativeModel(directory / "model.pte")
        usable = [f for f in fills if f + args.decode < model.info.max_seq_len]
        model.forward([1000], 0)  # warm up: first call pays for lazy initialization
        row = {"model": f"{directory.parent.name}/{directory.name}",
               "prefill_tok_s": round(prefill_rate(model, min(args.prefill, model.info.max_seq_len - 1),
                                                   args.chunk), 1)}
        for f in usable:
            row[f"decode_tok_s@{f}"] = round(decode_rate(model, f, args.decode, args.chunk), 1)
        if len(usable) > 1:
            row["decode_ratio_last/first"] = round(row[f"decode_tok_s@{usable[-1]}"] /
                                                   row[f"decode_tok_s@{usable[0]}"], 2)
        model.close()
        rows.append(row)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
