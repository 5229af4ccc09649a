"""Decode speed of a .pte exported with ExecuTorch's LLM custom ops
(llama::custom_sdpa / llama::update_cache), in one run:

  ours-sdpa   the custom-op export run by libetserve.so (our kernels)
  ours-plain  the same model's export without custom ops, by libetserve.so
  et-sdpa     the custom-op export run by the wheel's pybinding with
              ExecuTorch's own torch-linked kernels

Each variant runs in its own worker process (bench/runtimes.py: the torch-linked
kernels register into the same runtime library as ours, so they cannot share one).

    python bench/decode_custom_ops.py [--model smollm2-135m --ctx 512 --threads 2]
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.models import is_built, models_root  # noqa: E402
from bench.workers import Worker, WorkerError  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fills", default="128,450")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--variants", default="ours-sdpa,ours-plain,et-sdpa")
    args = ap.parse_args()
    fills = [int(x) for x in args.fills.split(",")]

    base = models_root() / args.model
    dirs = {"sdpa": base / f"ctx{args.ctx}-{args.dtype}-sdpa", "plain": base / f"ctx{args.ctx}-{args.dtype}"}
    table = {}
    for variant in args.variants.split(","):
        runner, kind = variant.split("-")
        if not is_built(dirs[kind]):
            print(f"{variant}: {dirs[kind]} not built, skipped")
            continue
        try:
            with Worker(runner, dirs[kind], args.threads) as worker:
                table[variant] = worker.call("decode", fills=fills, steps=args.steps)
        except WorkerError as e:
            print(f"{variant}: failed: {e}")

    print(f"\n{args.model} ctx{args.ctx} {args.dtype}, {args.threads} threads, "
          f"{args.steps} decode steps per fill")
    print(f"{'variant':<12}" + "".join(f"{'decode@' + str(f):>14}{'prefill@' + str(f):>14}"
                                      for f in fills))
    for variant, res in table.items():
        print(f"{variant:<12}" + "".join(f"{r['decode_tok_s']:>14.1f}{r['prefill_tok_s']:>14.1f}"
                                          for r in res))
    if "ours-sdpa" in table:
        ours = {r["fill"]: r["decode_tok_s"] for r in table["ours-sdpa"]}
        for variant, res in table.items():
            if variant == "ours-sdpa":
                continue
            ratios = ", ".join(f"@{r['fill']}: {ours[r['fill']] / r['decode_tok_s']:.2f}x"
                               for r in res)
            print(f"decode speed ours-sdpa / {variant}: {ratios}")
    print(json.dumps(table))


if __name__ == "__main__":
    main()
