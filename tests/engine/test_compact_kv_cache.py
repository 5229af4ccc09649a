"""The compact KV cache, opt-in (`--kv-cache int8`): ExecuTorch's quantize_kv_cache export (int8
keys and values with a float scale and an int8 zero point per position and kv head; our
llama::custom_quantized_sdpa kernel attends over it, with the int8 query that op takes) against
the default build, whose cache is fp32 (same weights, same XNNPACK graph; only the cache and the
attention's operands differ), over a real 4,096-token prompt of fixed text (bench/data's
held-out functions, then the opening of Coriolanus, then a question):

- at most a third of the fp32 cache's bytes per position;
- after every 512-token prefill chunk, and at NEW_TOKENS decode steps teacher-forced on the fp32
  build's greedy tokens (both read the same sequence, so a flipped near-tie does not send them
  down different texts): next-token distributions within MAX_KL, and the same top-1 on at least
  MIN_CONFIDENT_AGREEMENT of the steps where the fp32 build's top-2 margin is CONFIDENT_MARGIN
  or more;
- session snapshots hold the compact form and restore it exactly (the logits after a restore
  equal the uninterrupted run's, bit for bit).

Measured 2026-11-30 (ctx 32768 builds): 6,624 bytes per position against 24,576 (0.270); max
|logit diff| 3.3 and KL 0.13 after the prefill chunks, KL 0.16 over the forced steps, top-1 on
59 of 64; free-running greedy texts part after 5 tokens, and the int8 build's answer reads
another part of the prompt. Perplexity (bench/perplexity.py's text and windows) 102.09 against
98.16. That cost is why the default cache is fp32: this test states it, so a kernel bug (KL of
several) still fails here, and a better compact cache can be measured against the same numbers.

It builds nothing: the int8 build is the `--kv-cache int8` variant of the default build's options
(ETSERVE_TEST_QWEN_INT8KV_DIR overrides), built with `python -m app.models build
qwen2.5-coder-0.5b --kv-cache int8`; without it both tests skip.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

from app.engine import NativeModel
from app.text.chat_template import ChatTemplate
from app.text.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
PROMPT_TOKENS = 4096
NEW_TOKENS = 64
MAX_KL = 0.3  # measured up to 0.16: the int8 cache's cost, not a bound on a good cache
MIN_CONFIDENT_AGREEMENT = 0.9
CONFIDENT_MARGIN = 1.0


def _manifest(directory: Path) -> dict:
    return json.loads((directory / "etserve.json").read_text())


@pytest.fixture(scope="module")
def reference_dir(qwen_dir) -> Path:
    """The default build: its cache is fp32."""
    manifest = _manifest(qwen_dir)
    if manifest.get("kv_cache", "fp32") != "fp32":
        pytest.fail(f"the default Qwen build {qwen_dir} has an {manifest['kv_cache']} KV cache; the default is fp32")
    return qwen_dir


@pytest.fixture(scope="module")
def compact_dir(reference_dir) -> Path:
    explicit = os.environ.get("ETSERVE_TEST_QWEN_INT8KV_DIR")
    if explicit:
        path = Path(explicit)
    else:
        from app.models.eager import build_options
        from app.models.registry import model_dir

        options = build_options(_manifest(reference_dir))
        path = model_dir("qwen2.5-coder-0.5b", dataclasses.replace(options, kv_cache="int8"))
    if not (path / "model.pte").exists():
        pytest.skip(f"no int8-cache build at {path} (python -m app.models build qwen2.5-coder-0.5b --kv-cache int8)")
    return path


@pytest.fixture(scope="module")
def prompt_ids(compact_dir) -> list[int]:
    """A real 4,096-token chat prompt from fixed text: code, then prose, then a question."""
    tokenizer = Tokenizer.from_dir(compact_dir)
    template = ChatTemplate(tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token)
    data = ROOT / "bench" / "data"
    text = (data / "fim_functions.py").read_text() + "\n\n" + (data / "coriolanus.txt").read_text()
    question = "\n\nWhat is the text above about? Answer in detail."

    def render(body: str) -> list[int]:
        return tokenizer.encode(template.render([{"role": "user", "content": body + question}]))

    ids = render(text)
    assert len(ids) > PROMPT_TOKENS, len(ids)
    lo, hi = 0, len(text)  # the longest prefix of the text whose prompt fits PROMPT_TOKENS
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(render(text[:mid])) <= PROMPT_TOKENS:
            lo = mid
        else:
            hi = mid - 1
    ids = render(text[:lo])
    assert PROMPT_TOKENS - 8 <= len(ids) <= PROMPT_TOKENS
    return ids


def _logits(model: NativeModel) -> np.ndarray:
    return np.frombuffer(model.logits(), dtype=np.float32).copy()


def _run(directory: Path, ids: list[int], forced: list[int] | None = None
         ) -> tuple[list[np.ndarray], list[int], list[np.ndarray], int]:
    """Chunked prefill (logits after each chunk), then NEW_TOKENS decode steps: greedy, or
    reading `forced` (teacher forcing)."""
    model = NativeModel(directory / "model.pte")
    try:
        step = model.info.max_prefill_len
        chunk_logits = []
        for i in range(0, len(ids), step):
            model.forward(ids[i:i + step], i)
            chunk_logits.append(_logits(model))
        tokens, rows, pos = [], [], len(ids)
        for k in range(NEW_TOKENS):
            rows.append(_logits(model))
            tokens.append(forced[k] if forced is not None else int(rows[-1].argmax()))
            model.forward([tokens[-1]], pos)
            pos += 1
        return chunk_logits, tokens, rows, model.kv_info().bytes_per_position
    finally:
        model.close()


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    def log_softmax(x):
        x = x.astype(np.float64) - x.max()
        return x - np.log(np.exp(x).sum())
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum())


def test_the_int8_caches_cost_against_the_fp32_cache_over_a_long_prompt(compact_dir, reference_dir, prompt_ids):
    ref_chunks, ref_tokens, ref_rows, ref_bpp = _run(reference_dir, prompt_ids)
    chunks, free_tokens, _, bpp = _run(compact_dir, prompt_ids)
    _, _, rows, _ = _run(compact_dir, prompt_ids, forced=ref_tokens)
    tokenizer = Tokenizer.from_dir(compact_dir)

    print(f"\n{len(prompt_ids)} prompt tokens; bytes per position: int8 {bpp}, fp32 {ref_bpp} "
          f"({bpp / ref_bpp:.3f})")
    chunk_diff = [float(np.abs(a - b).max()) for a, b in zip(chunks, ref_chunks)]
    chunk_kl = [_kl(b, a) for a, b in zip(chunks, ref_chunks)]
    step_diff = [float(np.abs(a - b).max()) for a, b in zip(rows, ref_rows)]
    step_kl = [_kl(b, a) for a, b in zip(rows, ref_rows)]
    margins = [float(np.diff(np.sort(r)[-2:])[0]) for r in ref_rows]
    confident = [m >= CONFIDENT_MARGIN for m in margins]
    first_tie = next((k for k, c in enumerate(confident) if not c), NEW_TOKENS)
    same_free = next((k for k, (a, b) in enumerate(zip(free_tokens, ref_tokens)) if a != b), NEW_TOKENS)
    agree = [int(r.argmax()) == t for r, t in zip(rows, ref_tokens)]
    print(f"after each prefill chunk: max |logit diff| {max(chunk_diff):.4f}, max KL {max(chunk_kl):.5f}")
    print(f"{NEW_TOKENS} teacher-forced steps: max |logit diff| {max(step_diff):.4f}, max KL {max(step_kl):.5f}, "
          f"top-1 agreement {sum(agree)}/{NEW_TOKENS} ({sum(confident)} steps confident)")
    print(f"free-running greedy: identical for {same_free} tokens; the fp32 build's first near-tie at {first_tie}")
    print("int8:", repr(tokenizer.decode(free_tokens)))
    print("fp32:", repr(tokenizer.decode(ref_tokens)))

    assert bpp * 3 <= ref_bpp
    assert max(chunk_kl + step_kl) <= MAX_KL
    confident_agree = [a for a, c in zip(agree, confident) if c]
    assert sum(confident_agree) >= MIN_CONFIDENT_AGREEMENT * len(confident_agree)


def test_snapshots_hold_the_compact_cache(compact_dir, prompt_ids):
    """Sessions snapshot and restore the int8 caches with their scales and zero points."""
    model = NativeModel(compact_dir / "model.pte")
    try:
        ids = prompt_ids[:700]
        model.forward(ids[:512], 0)
        model.forward(ids[512:], 512)
        info = model.kv_info()
        # 24 layers x (key, value) x (int8 values, float scales, int8 zero points)
        assert info.n_caches == 24 * 2 * 3
        assert info.bytes_per_position == 24 * 2 * 2 * (64 + 4 + 1)
        snap = model.kv_snapshot(len(ids))
        assert len(snap) == len(ids) * info.bytes_per_position
        model.forward([ids[-1]], len(ids))
        expect = _logits(model)
        # Other tokens overwrite the cache rows; the snapshot brings them back.
        model.forward(prompt_ids[1000:1400], 300)
        model.kv_restore(len(ids), snap)
        model.forward([ids[-1]], len(ids))
        assert np.array_equal(_logits(model), expect)
    finally:
        model.close()
