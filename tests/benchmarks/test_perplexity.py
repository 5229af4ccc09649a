"""The perplexity bench's pure logic (bench/runtimes.py `perplexity_windows`, bench/perplexity.py
build selection), on fakes: a model whose logits at a position are a function of the tokens up to
it in its cache, so a position scored from a stale or missing cache entry shows."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.perplexity import builds_of, pick  # noqa: E402
from bench.runtimes import perplexity_windows  # noqa: E402

VOCAB = 13


def distribution(prefix: list[int]) -> np.ndarray:
    """The fake model's logits after `prefix` (positions 0..len-1)."""
    seed = sum((i + 1) * (t + 3) for i, t in enumerate(prefix))
    return np.array([((seed * 31 + k * 17) % 23) / 4.0 for k in range(VOCAB)], dtype=np.float32)


class FakeModel:
    def __init__(self, max_rows: int = 0):
        self.cache: dict[int, int] = {}
        self.last: np.ndarray | None = None
        self.max_rows = max_rows
        self.calls = 0

    def _prefix(self, pos: int) -> list[int]:
        return [self.cache[i] for i in range(pos + 1)]  # KeyError: a position never written

    def forward(self, tokens, pos):
        assert 0 < len(tokens)
        self.calls += 1
        for i, t in enumerate(tokens):
            self.cache[pos + i] = t
        self.last = distribution(self._prefix(pos + len(tokens) - 1))

    def logits(self):
        return self.last.tobytes()

    def rows(self, tokens, positions):
        assert 0 < len(tokens) <= self.max_rows
        assert positions == list(range(positions[0], positions[0] + len(tokens)))
        self.calls += 1
        for t, p in zip(tokens, positions):
            self.cache[p] = t
        out = [distribution(self._prefix(p)).tobytes() for p in positions]
        yield from out


def reference(ids: list[int], n_ctx: int, bos: int | None) -> tuple[float, int]:
    """llama-perplexity's scoring written out: every window whole, positions n_ctx/2..n_ctx-2
    predicting the next token."""
    nll, count = 0.0, 0
    for start in range(0, len(ids) - n_ctx + 1, n_ctx):
        window = ids[start:start + n_ctx]
        if bos is not None:
            window = [bos] + window[1:]
        for pos in range(n_ctx // 2, n_ctx - 1):
            row = distribution(window[:pos + 1]).astype(np.float64)
            nll += math.log(np.exp(row - row.max()).sum()) + row.max() - row[window[pos + 1]]
            count += 1
    return nll, count


IDS = [(i * 7 + i // 5) % VOCAB for i in range(16 * 3 + 5)]  # three windows of 16 and a partial one


@pytest.mark.parametrize("bos", [None, 12])
@pytest.mark.parametrize("max_rows", [0, 1, 4, 7, 32])
def test_windows_score_what_llama_perplexity_scores(bos, max_rows):
    m = FakeModel(max_rows)
    out = perplexity_windows(m.forward, m.logits, IDS, 16, bos, 3, m.rows if max_rows else None, max_rows)
    nll, count = reference(IDS, 16, bos)
    assert out["count"] == count == 3 * 7  # the partial window is dropped; 16 - 1 - 8 per window
    assert out["windows"] == 3
    assert out["nll"] == pytest.approx(nll, rel=1e-12)
    assert out["ppl"] == pytest.approx(math.exp(nll / count), rel=1e-12)
    assert out["calls"] == m.calls


def test_rows_and_decode_steps_give_the_same_figure_in_fewer_calls():
    steps, rows = FakeModel(), FakeModel(8)
    a = perplexity_windows(steps.forward, steps.logits, IDS, 16, 12, 4, None, 0)
    b = perplexity_windows(rows.forward, rows.logits, IDS, 16, 12, 4, rows.rows, 8)
    assert a["nll"] == b["nll"]
    # per window: plain 0..8 in chunks of 4 (3 calls) + 6 decode steps; rows 0..7 (2) + 7 rows in one
    assert (a["calls"], b["calls"]) == (3 * 9, 3 * 3)


def test_bos_replaces_each_windows_first_token():
    m = FakeModel(4)
    with_bos = perplexity_windows(m.forward, m.logits, IDS, 16, 12, 3, m.rows, 4)
    assert m.cache[0] == 12 and m.cache[1] == IDS[33]  # the last window: ids[32:48], its first replaced
    without = perplexity_windows(m.forward, m.logits, IDS, 16, None, 3, m.rows, 4)
    assert m.cache[0] == IDS[32]
    assert with_bos["nll"] != without["nll"]


def test_too_short_a_text_scores_nothing():
    m = FakeModel()
    out = perplexity_windows(m.forward, m.logits, IDS[:15], 16, None, 3)
    assert (out["count"], out["ppl"], m.calls) == (0, None, 0)


def _build(root: Path, name: str, gguf: Path | None, size: int | None = None, rows: int | None = None,
           quantize: str = "none", ctx: int = 512) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "model.pte").write_bytes(b"pte")
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest() if gguf else "0" * 64
    size = gguf.stat().st_size if size is None and gguf else size
    (d / "etserve.json").write_text(json.dumps({"source": {"gguf_size": size, "gguf_sha256": digest},
                                                "quantize": quantize, "logit_rows": rows, "max_seq_len": ctx}))
    return d


def test_builds_of_a_gguf_are_the_ones_its_checksum_names(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(100))
    other = tmp_path / "o.gguf"
    other.write_bytes(b"GGUF" + bytes(99) + b"x")  # same size, other bytes
    mine = _build(tmp_path, "m/ctx512-fp32-sdpa", gguf)
    same_size = _build(tmp_path, "o/ctx512-fp32-sdpa", other)
    unrelated = _build(tmp_path, "u/ctx512-fp32-sdpa", None, size=7)
    unfinished = _build(tmp_path, "m/ctx1024-fp32-sdpa", gguf)
    (unfinished / "model.pte").unlink()
    too_short = _build(tmp_path, "m/ctx128-fp32-sdpa", gguf, ctx=128)  # holds no 512-token window
    assert builds_of(gguf, [mine, same_size, unrelated, unfinished, too_short]) == [mine]
    assert builds_of(gguf, [same_size, unrelated]) == []


def test_pick_prefers_the_named_build_then_rows_builds(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    plain = _build(tmp_path, "m/ctx1024-fp32-sdpa", gguf)
    rows = _build(tmp_path, "m/ctx512-fp32-sdpa-r32", gguf, rows=32)
    quant = _build(tmp_path, "m/ctx32768-8da4w-e4-sdpa-kv8-r32", gguf, rows=32, quantize="8da4w")
    builds = [plain, rows, quant]
    assert pick(builds, plain) == plain
    assert pick(builds, tmp_path / "m" / "absent") in (rows, quant)
    assert pick(builds, None, quantized=False) == rows
    assert pick(builds, None, quantized=True) == quant
    assert pick([plain], None, quantized=True) is None
    assert pick([], None) is None


def test_pick_by_quantization_passes_over_a_named_build_of_another(tmp_path):
    """The served row takes the 8da4w build and the 8da8w row its own, even when the bench is
    pointed at the other one."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    q4 = _build(tmp_path, "m/ctx32768-8da4w-e4-sdpa-kv8-r32", gguf, rows=32, quantize="8da4w")
    q8 = _build(tmp_path, "m/ctx2048-8da8w-e4-sdpa-kv8-r32", gguf, rows=32, quantize="8da8w")
    assert pick([q4, q8], q8, quantize="8da4w") == q4
    assert pick([q4, q8], q4, quantize="8da8w") == q8
    assert pick([q4], None, quantize="8da8w") is None
    assert pick([q4, q8], q8, quantized=True) == q8


def test_builds_of_looks_in_the_registrys_builds_and_build_ggufs(tmp_path, monkeypatch):
    monkeypatch.setenv("ETSERVE_CACHE", str(tmp_path))
    gguf = tmp_path / "gguf" / "m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(10))
    named = _build(tmp_path / "models", "m/ctx512-fp32-sdpa-r32", gguf)
    by_file = _build(tmp_path / "models", "gguf/0123456789abcdef/ctx2048-fp32-sdpa", gguf)
    assert sorted(builds_of(gguf)) == sorted([named, by_file])


def test_the_q4_0_files_row_says_how_to_make_what_is_missing(tmp_path, monkeypatch):
    """Without llama.cpp's Q4_0 file the row says to make it; with the file and no build of it, the
    build command with the served options, in the row's own place in the table."""
    from types import SimpleNamespace

    from bench import perplexity

    monkeypatch.setenv("ETSERVE_CACHE", str(tmp_path))
    q4_0 = tmp_path / "peer" / "q4_0.gguf"
    monkeypatch.setattr(perplexity.peer, "gguf_path", lambda: q4_0)
    case = next(c for c in perplexity.cases(SimpleNamespace(model_dir=None)) if c.name == perplexity.QWEN2_Q4_0_FILE)
    rows = perplexity.perplexity_rows(SimpleNamespace(threads=1), {}, [case])
    assert [r.name for r in rows] == [perplexity.QWEN2_Q4_0_FILE]
    assert "not made: python -m bench.peer gguf" in rows[0].measured
    q4_0.parent.mkdir()
    q4_0.write_bytes(b"GGUF" + bytes(10))
    rows = perplexity.perplexity_rows(SimpleNamespace(threads=1), {}, [case])
    assert f"build-gguf {q4_0} --quantize 8da4w" in rows[0].measured and "--kv-cache int8" in rows[0].measured
    assert perplexity.NAMES.index(perplexity.QWEN2_Q4_0_FILE) == perplexity.NAMES.index(perplexity.QWEN2_Q4_0) + 1
