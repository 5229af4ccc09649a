"""The default Qwen .pte (8da4w, 4-bit embeddings, custom sdpa/KV-cache ops) computes what the
eager PyTorch model it was exported from computes.

The reference is ExecuTorch's own eager llama module built by the exporter's `get_llama_model`
with our build's LlmConfig, from a checkpoint regenerated from the GGUF: the same torchao
quantization (HQQ scales), embedding quantization and custom-op modules, but run by PyTorch
instead of XNNPACK and our kernels (app/models/eager.py). It runs in a subprocess (its custom-op
library registers kernels in the runtime libetserve.so uses).

Greedy agreement is checked by teacher forcing: our .pte generates NEW_TOKENS greedily, and the
eager model scores that whole sequence in one forward call. The eager model's argmax equals our
token at every position before the first disagreement, so its own greedy run would produce the
same tokens up to there: the first disagreement is where the two greedy texts would part.
XNNPACK's int4 kernels are not bit-identical to torchao's eager reference (bf16 group scales,
int8 activation rounding, accumulation order), so the test asserts what holds beyond that:
logits within MAX_LOGIT_DIFF and next-token distributions within MAX_KL at every position, the
same top-1 wherever the eager model is not near a tie (top-2 margin >= CONFIDENT_MARGIN), top-1
agreement on at least MIN_AGREEMENT of the positions, and, for the code prompt, identical greedy
tokens for the first IDENTICAL_PREFIX. Near-ties do flip: with the story prompt the greedy texts
part at token 3 (a character's name). For scale: the same eager quantized model against the fp32
model (transformers on the GGUF) differs by ~4.6 in logits and ~0.13 in KL on the code prompt;
our .pte against it, by ~1.1 and ~0.01.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from app.engine import NativeModel
from app.models.manifest import read_manifest
from app.text.chat_template import ChatTemplate
from app.text.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
NEW_TOKENS = 64
CODE_PROMPT = "Write a Python function that checks whether a number is prime."
STORY_PROMPT = "Tell me a short story about a robot who learns to paint."
# Code prompt: identical for all 64 tokens on AMX hosts; on an AMD EPYC host (AVX2, generic
# attention kernel) the texts part at token 19 ('(n' for '(number', eager top-2 margin 0.26,
# where logits differ by ~0.8 at the median position), 64/64 before the generic kernel's exact
# int32 scores. 16 still covers the reply's opening through `def is_prime(`.
IDENTICAL_PREFIX = 16
# Measured (story prompt, the near-tie-rich one): 57/64 on an AMD EPYC host (AVX2: XNNPACK's
# AVX2 kernels, the generic attention kernel), every flip where the eager top-2 margin was
# <= 0.21, against logits that differ by up to ~1.1 anywhere; higher on AMX hosts.
MIN_AGREEMENT = 0.85
CONFIDENT_MARGIN = 1.0
MAX_LOGIT_DIFF = 2.0
MAX_KL = 0.06

pytestmark = pytest.mark.slow


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    """KL(p || q) of the softmaxes, row by row."""
    def log_softmax(x):
        x = x.astype(np.float64) - x.max(axis=1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(axis=1)


def _native_greedy(model: NativeModel, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """Our .pte through app.engine: prefill in chunks, then n greedy tokens; the logits that chose each."""
    step = model.info.max_prefill_len
    for i in range(0, len(ids), step):
        model.forward(ids[i:i + step], i)
    tokens, rows, pos = [], [], len(ids)
    for _ in range(n):
        logits = np.frombuffer(model.logits(), dtype=np.float32).copy()
        rows.append(logits)
        tokens.append(int(logits.argmax()))
        if len(tokens) < n:
            model.forward([tokens[-1]], pos)
            pos += 1
    return tokens, np.stack(rows)


def test_qwen_pte_matches_the_exporters_eager_model(qwen_dir, tmp_path):
    for module in ("torch", "executorch.exir", "torchao"):  # found, not imported: the subprocess imports them
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    manifest = read_manifest(qwen_dir)
    assert manifest["name"] == "qwen2.5-coder-0.5b" and manifest["custom_ops"], manifest["variant"]
    tokenizer = Tokenizer.from_dir(qwen_dir)
    template = ChatTemplate(tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token)

    t0 = time.monotonic()
    native = NativeModel(qwen_dir / "model.pte")
    runs = []
    for prompt in (CODE_PROMPT, STORY_PROMPT):
        ids = tokenizer.encode(template.render([{"role": "user", "content": prompt}]))
        ours, logits = _native_greedy(native, ids, NEW_TOKENS)
        runs.append((prompt, ids, ours, logits))
    native.close()
    t1 = time.monotonic()
    # The eager model scores prompt + our tokens; the row at position p predicts token p + 1.
    request = [{"tokens": ids + ours[:-1], "from": len(ids) - 1} for _, ids, ours, _ in runs]
    (tmp_path / "request.json").write_text(json.dumps(request))
    proc = subprocess.run(
        [sys.executable, "-m", "app.models.eager", str(qwen_dir), str(tmp_path / "request.json"),
         str(tmp_path / "eager.npz")],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    if proc.returncode != 0:
        pytest.fail("eager reference failed:\n" + proc.stderr[-4000:])
    t2 = time.monotonic()
    eager = np.load(tmp_path / "eager.npz")
    print(f"\n{manifest['variant']}: ours {t1 - t0:.1f}s, eager {t2 - t1:.1f}s")

    failures = []
    for k, (prompt, ids, ours, our_logits) in enumerate(runs):
        ref_logits = eager[f"arr_{k}"]
        assert ref_logits.shape == our_logits.shape
        theirs = ref_logits.argmax(axis=1).tolist()
        agree = [a == b for a, b in zip(ours, theirs)]
        first = next((i for i, ok in enumerate(agree) if not ok), None)
        diffs = np.abs(our_logits - ref_logits).max(axis=1)
        kl = _kl(ref_logits, our_logits)
        top2 = np.sort(ref_logits, axis=1)[:, -2:]
        margin = top2[:, 1] - top2[:, 0]
        print(f"{prompt!r} ({len(ids)} prompt tokens):")
        print(f"  step-0 logits max abs diff {diffs[0]:.4f} (logit range {np.abs(ref_logits[0]).max():.1f}); "
              f"over {NEW_TOKENS} positions max {diffs.max():.4f}, median {np.median(diffs):.4f}")
        print(f"  KL(eager || ours) max {kl.max():.5f}, mean {kl.mean():.5f}")
        print(f"  top-1 agreement {sum(agree)}/{NEW_TOKENS}; first greedy divergence: {first}")
        for i, ok in enumerate(agree):
            if not ok:
                print(f"    position {i}: ours {tokenizer.decode([ours[i]])!r}, eager {tokenizer.decode([theirs[i]])!r}, "
                      f"eager top-2 margin {margin[i]:.4f}")
        print("  ours:", repr(tokenizer.decode(ours)))
        if diffs.max() >= MAX_LOGIT_DIFF or kl.max() >= MAX_KL:
            failures.append(f"{prompt!r}: logits differ by {diffs.max():.3f}, KL {kl.max():.4f}")
        if sum(agree) < MIN_AGREEMENT * NEW_TOKENS:
            failures.append(f"{prompt!r}: top-1 agreement {sum(agree)}/{NEW_TOKENS}")
        confident_flips = [i for i, ok in enumerate(agree) if not ok and margin[i] >= CONFIDENT_MARGIN]
        if confident_flips:
            failures.append(f"{prompt!r}: top-1 differs where the eager margin is >= {CONFIDENT_MARGIN}: "
                            f"{confident_flips}")
        if prompt == CODE_PROMPT and first is not None and first < IDENTICAL_PREFIX:
            failures.append(f"{prompt!r}: greedy texts part at token {first}")
    assert not failures, failures
