"""Decode speed of a .pte exported with ExecuTorch's LLM custom ops
(llama::custom_sdpa / llama::update_cache), in one run:

  ours-sdpa   the custom-op export run by libetserve.so (our kernels)
  ours-plain  the same model's export without custom ops, by libetserve.so
  et-sdpa     the custom-op export run by the wheel's pybinding with
              ExecuTorch's own torch-linked kernels

Each variant runs in its own subprocess (the torch-linked kernels register
into the same runtime library as ours, so they cannot share a process).

    python bench/decode_custom_ops.py [--model smollm2-135m --ctx 512 --threads 2]
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = Path(os.environ.get("ETSERVE_MODELS", Path.home() / ".cache/etserve/models"))


def tokens_for(n, vocab):
    return [(17 + 7919 * i) % vocab for i in range(n)]


def worker_ours(path, threads, fills, steps):
    sys.path.insert(0, str(ROOT))
    from app.engine.native import NativeModel, set_num_threads

    set_num_threads(threads)
    model = NativeModel(path)
    return run_fills(model.forward, model.info.max_prefill_len, model.info.vocab_size, fills, steps)


def worker_et(path, threads, fills, steps):
    import torch
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401 (registers kernels)
    from executorch.extension.pybindings import portable_lib as pl

    pl._unsafe_reset_threadpool(threads)
    m = pl._load_for_executorch(str(path))
    meta = m.method_meta("forward")
    max_prefill = meta.input_tensor_meta(0).sizes()[1]
    vocab = meta.output_tensor_meta(0).sizes()[-1]

    def forward(toks, pos):
        m.forward((torch.tensor([toks], dtype=torch.long),
                   torch.tensor([pos], dtype=torch.long)))

    return run_fills(forward, max_prefill, vocab, fills, steps)


def run_fills(forward, max_prefill, vocab, fills, steps):
    results = []
    for fill in fills:
        toks = tokens_for(fill, vocab)
        t0 = time.perf_counter()
        for s in range(0, fill, max_prefill):
            forward(toks[s:s + max_prefill], s)
        prefill_s = time.perf_counter() - t0
        for k in range(3):  # warm-up at the same positions
            forward([toks[k % len(toks)]], fill + k)
        t0 = time.perf_counter()
        for k in range(steps):
            forward([toks[k % len(toks)]], fill + k)
        dt = time.perf_counter() - t0
        results.append({"fill": fill, "decode_tok_s": steps / dt,
                        "prefill_tok_s": fill / prefill_s})
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fills", default="128,450")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--variants", default="ours-sdpa,ours-plain,et-sdpa")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--pte", help=argparse.SUPPRESS)
    args = ap.parse_args()
    fills = [int(x) for x in args.fills.split(",")]

    if args.worker:
        fn = worker_ours if args.worker == "ours" else worker_et
        print("RESULT " + json.dumps(fn(Path(args.pte), args.threads, fills, args.steps)))
        return

    base = MODELS / args.model
    ptes = {"sdpa": base / f"ctx{args.ctx}-{args.dtype}-sdpa" / "model.pte",
            "plain": base / f"ctx{args.ctx}-{args.dtype}" / "model.pte"}
    table = {}
    for variant in args.variants.split(","):
        runner, kind = variant.split("-")
        pte = ptes[kind]
        if not pte.exists():
            print(f"{variant}: {pte} missing, skipped")
            continue
        cmd = [sys.executable, __file__, "--worker", runner, "--pte", str(pte),
               "--threads", str(args.threads), "--fills", args.fills,
               "--steps", str(args.steps)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            print(f"{variant}: failed\n{proc.stderr[-2000:]}")
            continue
        table[variant] = json.loads(line[0][7:])

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
