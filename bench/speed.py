"""Prefill and decode speed of built models through our native runtime, side by side.

    python bench/speed.py [MODEL_DIR ...] [--threads 2] [--fills 128,400] [--decode 32]

With no MODEL_DIR, every complete build under the model cache is measured, each in its own
worker process (bench/runtimes.py). Decode speed is measured at each context fill (tokens
already in the KV cache) so the cost of a longer context shows as a ratio against the first
fill; the prefill rate is that of the first fill's prompt.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.decoding import fills_within  # noqa: E402
from bench.models import built_models, model_json  # noqa: E402
from bench.workers import Worker  # noqa: E402


def measure(model_dir: Path, fills: list[int], steps: int, threads: int) -> dict:
    fills = fills_within(model_json(model_dir, "etserve.json")["max_seq_len"], fills, steps)
    with Worker("ours", model_dir, threads) as worker:
        results = worker.call("decode", fills=fills, steps=steps)
    row = {"model": f"{model_dir.parent.name}/{model_dir.name}",
           "prefill_tok_s": round(results[0]["prefill_tok_s"], 1)}
    for r in results:
        row[f"decode_tok_s@{r['fill']}"] = round(r["decode_tok_s"], 1)
    if len(results) > 1:
        row["decode_ratio_last/first"] = round(results[-1]["decode_tok_s"] / results[0]["decode_tok_s"], 2)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", type=Path)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--fills", default="128,400")
    p.add_argument("--decode", type=int, default=32)
    args = p.parse_args()
    fills = [int(x) for x in args.fills.split(",")]
    for directory in args.models or built_models():
        print(json.dumps(measure(directory, fills, args.decode, args.threads)), flush=True)


if __name__ == "__main__":
    main()
