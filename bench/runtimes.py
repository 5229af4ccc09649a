"""One model in one runtime, in its own process, driven by bench.workers.Worker over JSON lines.

    python -m bench.runtimes {ours,et,runner} MODEL_DIR [--threads 2]

  ours    model.pte by libetserve.so (our kernels for the LLM custom ops), greedy sampling
          by our native sampler
  et      model.pte by the wheel's pybinding with ExecuTorch's own torch-linked kernels for
          the custom ops (registered by importing executorch.extension.llm.custom_ops) and
          its quantized kernels (libexecutorch_kernels_quantized.so), argmax
  runner  ExecuTorch's LLM runner (executorch.extension.llm.runner.TextLLMRunner) on
          model.pte and tokenizer.json, with the same custom-op kernels as `et`

Requests: {"op": "decode", "fills": [...], "steps": N, "ids": [...]?, "logit_bias": {...}?}
(ours, et: bench.decoding.decode_fills); {"op": "perplexity", "ids": [...], "n_ctx": 512,
"bos": id or null, "use_rows": true} (ours: llama-perplexity's windows, see `perplexity_windows`;
a rows build scores a forward_rows call's worth of positions per call unless use_rows is false); and
{"op": "generate", "prompt": str, "max_new_tokens": N} (runner). The first line out is the
model's info, or {"error": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.decoding import decode_fills  # noqa: E402
from bench.prompts import filler  # noqa: E402


def open_ours(model_dir: Path, threads: int) -> dict:
    from app.engine import NativeModel, NativeError, SamplingParams, set_num_threads

    set_num_threads(threads)
    model = NativeModel(model_dir / "model.pte")
    model.forward([1000], 0)  # the first call pays for lazy initialization (and finds the caches)
    try:
        kv_bytes = model.kv_info().bytes_per_position
    except NativeError:  # an export without the custom ops: no caches we can see
        kv_bytes = None
    from app.engine import native

    lib = native.library()
    info = {"vocab": model.info.vocab_size, "max_seq_len": model.info.max_seq_len,
            "max_prefill": model.info.max_prefill_len, "kv_bytes_per_position": kv_bytes,
            "isa": lib.ets_vector_isa().decode(), "attention": native.int8_attention(lib),
            "forced_isa": os.environ.get("ETSERVE_ISA") or None, "cpu_mask": os.environ.get("ETSERVE_CPU_MASK") or None}

    def decode(fills, steps, ids=None, logit_bias=None):
        params = SamplingParams(temperature=0.0, logit_bias={int(k): v for k, v in (logit_bias or {}).items()})
        rng = [0]

        def choose() -> int:
            token, _, rng[0] = model.sample(params, rng[0])
            return token

        ids = ids or filler(max(fills), info["vocab"])
        return decode_fills(model.forward, choose, ids, fills, steps, min(128, info["max_prefill"]))

    def rows(tokens, positions):
        model.forward_rows(tokens, positions, [0] * len(tokens))  # slot 0: the program's own caches
        for r in range(len(tokens)):
            model.use_row(r)
            yield model.logits()

    def perplexity(ids, n_ctx, bos=None, use_rows=True):
        import time

        started = time.monotonic()
        out = perplexity_windows(model.forward, model.logits, ids, n_ctx, bos, min(128, info["max_prefill"]),
                                 rows, model.info.max_rows if use_rows else 0)
        return {**out, "rows": model.info.max_rows if use_rows else 0, "seconds": time.monotonic() - started}

    return {"info": info, "decode": decode, "perplexity": perplexity}


def perplexity_windows(forward, logits, ids, n_ctx, bos, chunk, rows=None, max_rows=0) -> dict:
    """Perplexity over `ids` scored as llama.cpp's llama-perplexity scores it: the text cut into
    windows of n_ctx tokens (a trailing partial window is dropped), each evaluated from an empty
    cache (its first token replaced by `bos` when the model adds one), and in each window only
    the tokens after the first half are scored (each predicted from at least n_ctx/2 tokens).

    A plain build returns the logits of a forward call's last position only: the first half is
    prefilled in chunks of `chunk`, then each scored position is one forward of one token (a
    decode step per scored token). A rows build (`rows(tokens, positions)`: one forward_rows
    call, yielding each row's logits in order; `max_rows` > 0) prefills the first half but its
    last token, then scores up to max_rows positions per call, each row bit for bit the decode
    step of its token (tests/engine/test_rows.py). Either way exact: every prediction is the
    model's own full-vocabulary distribution at that position; log-softmax in float64."""
    import math

    import numpy as np

    first = n_ctx // 2
    nll, count, calls = 0.0, 0, 0

    def score(row, target: int) -> float:
        row = np.frombuffer(row, dtype=np.float32).astype(np.float64)
        top = row.max()
        return top + math.log(np.exp(row - top).sum()) - row[target]

    for start in range(0, len(ids) - n_ctx + 1, n_ctx):
        window = list(ids[start:start + n_ctx])
        if bos is not None:
            window[0] = bos
        if rows is not None and max_rows > 0:
            for pos in range(0, first, chunk):  # positions 0..first-1; the rows calls start at first
                forward(window[pos:min(pos + chunk, first)], pos)
                calls += 1
            for pos in range(first, n_ctx - 1, max_rows):  # scored positions first..n_ctx-2
                end = min(pos + max_rows, n_ctx - 1)
                for i, row in enumerate(rows(window[pos:end], list(range(pos, end)))):
                    nll += score(row, window[pos + i + 1])
                    count += 1
                calls += 1
            continue
        for pos in range(0, first + 1, chunk):  # positions 0..first: the last one predicts first+1
            forward(window[pos:min(pos + chunk, first + 1)], pos)
            calls += 1
        for pos in range(first, n_ctx - 1):
            if pos > first:
                forward([window[pos]], pos)
                calls += 1
            nll += score(logits(), window[pos + 1])
            count += 1
    return {"nll": nll, "count": count, "windows": len(ids) // n_ctx, "calls": calls,
            "ppl": math.exp(nll / count) if count else None}


def _custom_ops_runtime(threads: int):
    import ctypes

    import torch
    import executorch
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401 (registers the kernels)
    from executorch.extension.pybindings import portable_lib

    # quantized_decomposed::embedding_4bit (4-bit embedding tables, the -e4 builds): the wheel's
    # quantized kernel library (native/ links the same one) registers it into libexecutorch.so,
    # which the pybinding and the runner share; neither loads it by itself.
    lib = Path(list(executorch.__path__)[0]) / "lib" / "libexecutorch_kernels_quantized.so"
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)

    portable_lib._unsafe_reset_threadpool(threads)
    return torch, portable_lib


def open_et(model_dir: Path, threads: int) -> dict:
    torch, portable_lib = _custom_ops_runtime(threads)
    module = portable_lib._load_for_executorch(str(model_dir / "model.pte"))
    meta = module.method_meta("forward")
    info = {"vocab": meta.output_tensor_meta(0).sizes()[-1], "max_prefill": meta.input_tensor_meta(0).sizes()[1]}
    rows = meta.num_inputs() == 3  # a rows build (app/models/export.py rows_example_inputs)
    last = [None]

    def forward(tokens, pos):
        tokens = torch.tensor([list(tokens)], dtype=torch.long)
        if rows:  # every token's own position, and the last token's logits only
            n = tokens.shape[1]
            inputs = (tokens, torch.arange(pos, pos + n, dtype=torch.long), torch.tensor([n - 1], dtype=torch.long))
        else:
            inputs = (tokens, torch.tensor([pos], dtype=torch.long))
        last[0] = module.forward(inputs)[0]

    def choose() -> int:  # greedy, like ours (which token it is does not change the cost)
        return int(last[0][0, -1].argmax())

    forward([1000], 0)

    def decode(fills, steps, ids=None, logit_bias=None):
        ids = ids or filler(max(fills), info["vocab"])
        return decode_fills(forward, choose, ids, fills, steps, min(128, info["max_prefill"]))

    return {"info": info, "decode": decode}


def open_runner(model_dir: Path, threads: int) -> dict:
    manifest = model_dir / "etserve.json"
    if manifest.exists() and json.loads(manifest.read_text()).get("linear_kernel") == "etserve":
        # The runner would fail at its first generation with "kernel 'etserve::linear_q4.out'
        # not found" in its log and only "Generation failed" to say.
        raise RuntimeError("the .pte calls etserve::linear_q4 (our 4-bit linear), which ExecuTorch's "
                           "runner does not have; build with --linear-kernel xnnpack to compare")
    _custom_ops_runtime(threads)
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    runner = TextLLMRunner(str(model_dir / "model.pte"), str(model_dir / "tokenizer.json"))

    def generate(prompt, max_new_tokens):
        runner.reset()  # else it continues after the previous generation's positions
        pieces, stats = [], {}
        config = GenerationConfig(echo=False, max_new_tokens=max_new_tokens, temperature=0.0)
        runner.generate(prompt, config, pieces.append, lambda s: stats.update(json.loads(s.to_json_string())))
        # ExecuTorch's own decode rate: tokens after the first over the time after the first
        decode_s = (stats["inference_end_ms"] - stats["first_token_ms"]) / 1000
        return {"prompt_tokens": stats["prompt_tokens"], "generated_tokens": stats["generated_tokens"] + 1,
                "decode_tok_s": stats["generated_tokens"] / decode_s, "text": "".join(pieces)}

    return {"info": {"vocab": runner.get_vocab_size()}, "generate": generate}


OPENERS = {"ours": open_ours, "et": open_et, "runner": open_runner}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=sorted(OPENERS))
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    # The protocol owns stdout; whatever the runtimes print goes to stderr (the worker's log).
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def reply(obj) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    try:
        handlers = OPENERS[args.kind](args.model_dir, args.threads)
    except Exception as e:  # the caller reports why this runtime cannot load the file
        reply({"error": f"{type(e).__name__}: {e}".strip()[:500]})
        return
    reply(handlers.pop("info"))
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply(handlers[request.pop("op")](**request))
        except Exception as e:  # e.g. the runner loads the file lazily, at its first generation
            reply({"error": f"{type(e).__name__}: {e}".strip()[:500]})


if __name__ == "__main__":
    main()
