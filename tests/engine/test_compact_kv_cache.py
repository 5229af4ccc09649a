"""The compact KV cache: the default Qwen build stores its cache in int8 (ExecuTorch's
quantize_kv_cache export: int8 keys and values with a float scale and an int8 zero point per
position and kv head; our llama::custom_quantized_sdpa kernel attends over it). Against the same
model exported with an fp32 cache (same weights, same XNNPACK graph; only the cache and the
attention's operands differ), over a real 4,096-token prompt:

- logits within MAX_LOGIT_DIFF (absolute) and next-token distributions within MAX_KL after every
  512-token prefill chunk and at every one of NEW_TOKENS greedy steps;
- the NEW_TOKENS greedy tokens identical;
- at most a third of the fp32 cache's bytes per position;
- session snapshots hold the compact form and restore it exactly (the logits after a restore
  equal the uninterrupted run's, bit for bit).

Measured (2026-11-30, ctx 32768 builds): see the printed figures; the tolerances leave ~2x room.

It builds nothing: the fp32-cache reference is the `--kv-cache fp32` variant of the default
build's options (ETSERVE_TEST_QWEN_FP32KV_DIR overrides), built once with
`python -m app.models build qwen2.5-coder-0.5b --kv-cache fp32`; without it the comparison is
skipped (the snapshot test still runs).
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
MAX_LOGIT_DIFF = 1.0
MAX_KL = 0.02


def _manifest(directory: Path) -> dict:
    return json.loads((directory / "etserve.json").read_text())


@pytest.fixture(scope="module")
def compact_dir(qwen_dir) -> Path:
    manifest = _manifest(qwen_dir)
    if manifest.get("kv_cache", "fp32") != "int8":
        pytest.fail(f"the default Qwen build {qwen_dir} has an fp32 KV cache; the default is int8")
    return qwen_dir


@pytest.fixture(scope="module")
def reference_dir(compact_dir) -> Path:
    explicit = os.environ.get("ETSERVE_TEST_QWEN_FP32KV_DIR")
    if explicit:
        path = Path(explicit)
    else:
        from app.models.eager import build_options
        from app.models.registry import model_dir

        options = build_options(_manifest(compact_dir))
        path = model_dir("qwen2.5-coder-0.5b", dataclasses.replace(options, kv_cache="fp32"))
    if not (path / "model.pte").exists():
        pytest.skip(f"no fp32-cache reference build at {path} "
                    "(python -m app.models build qwen2.5-coder-0.5b --kv-cache fp32)")
    return path


@pytest.fixture(scope="module")
def prompt_ids(compact_dir) -> list[int]:
    """A real 4,096-token chat prompt: this repository's README and engine sources, then a question."""
    tokenizer = Tokenizer.from_dir(compact_dir)
    template = ChatTemplate(tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token)
    text = (ROOT / "README.md").read_text()
    for path in sorted((ROOT / "app" / "engine").glob("*.py")):
        text += f"\n\n# {path.name}\n" + path.read_text()
    question = "\n\nWhich module of this project samples the next token, and how? Answer in detail."

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


def _run(directory: Path, ids: list[int]) -> tuple[list[np.ndarray], list[int], list[np.ndarray], int]:
    """Chunked prefill (logits after each chunk), then NEW_TOKENS greedy steps."""
    model = NativeModel(directory / "model.pte")
    try:
        step = model.info.max_prefill_len
        chunk_logits = []
        for i in range(0, len(ids), step):
            model.forward(ids[i:i + step], i)
            chunk_logits.append(_logits(model))
        tokens, rows, pos = [], [], len(ids)
        for _ in range(NEW_TOKENS):
            rows.append(_logits(model))
            tokens.append(int(rows[-1].argmax()))
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


def test_int8_cache_matches_the_fp32_cache_over_a_long_prompt(compact_dir, reference_dir, prompt_ids):
    ref_chunks, ref_tokens, ref_rows, ref_bpp = _run(reference_dir, prompt_ids)
    chunks, tokens, rows, bpp = _run(compact_dir, prompt_ids)
    tokenizer = Tokenizer.from_dir(compact_dir)

    print(f"\n{len(prompt_ids)} prompt tokens; bytes per position: int8 {bpp}, fp32 {ref_bpp} "
          f"({bpp / ref_bpp:.3f})")
    chunk_diff = [float(np.abs(a - b).max()) for a, b in zip(chunks, ref_chunks)]
    chunk_kl = [_kl(b, a) for a, b in zip(chunks, ref_chunks)]
    step_diff = [float(np.abs(a - b).max()) for a, b in zip(rows, ref_rows)]
    step_kl = [_kl(b, a) for a, b in zip(rows, ref_rows)]
    print(f"after each prefill chunk: max |logit diff| {max(chunk_diff):.4f}, max KL {max(chunk_kl):.5f}")
    print(f"over {NEW_TOKENS} greedy steps: max |logit diff| {max(step_diff):.4f} "
          f"(logit range {np.abs(ref_rows[0]).max():.1f}), max KL {max(step_kl):.5f}")
    print("int8:", repr(tokenizer.decode(tokens)))
    print("fp32:", repr(tokenizer.decode(ref_tokens)))

    assert bpp * 3 <= ref_bpp
    assert tokens == ref_tokens
    assert max(chunk_diff + step_diff) <= MAX_LOGIT_DIFF
    assert max(chunk_kl + step_kl) <= MAX_KL


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
