"""The HQQ cache (app/models/quant_cache.py) replays torchao's results bit for bit, keyed by the
weight's content, and its file name ignores the context length but not the quantization options."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")

from app.models import quant_cache  # noqa: E402
from app.models.quant_cache import HqqCache, cache_file, pack, unpack  # noqa: E402
from app.models.registry import get_spec, resolve_options  # noqa: E402


def _hqq():
    import importlib

    return getattr(importlib.import_module(quant_cache.HQQ_MODULE), quant_cache.HQQ_FUNCTION)


@pytest.mark.parametrize("qmin,qmax", [(-8, 7), (-128, 127)])
def test_pack_round_trip(qmin, qmax):
    g = torch.Generator().manual_seed(0)
    q = torch.randint(qmin, qmax + 1, (6, 64), generator=g, dtype=torch.int32)
    scale = torch.rand(6, 2, generator=g)
    entry = pack(q, scale, qmin, qmax)
    assert ("q4" in entry) == (qmax <= 7)
    if "q4" in entry:
        assert entry["q4"].numel() == q.numel() // 2
    q2, s2 = unpack(entry)
    assert q2.dtype == torch.int32 and torch.equal(q2, q) and torch.equal(s2, scale)


def _quantize_linears(seed: int):
    """A small model quantized by torchao's own 8da4w path (HQQ scales), as the exporter calls it."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Linear(48, 32, bias=False))
    quantize_(model, Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4, weight_granularity=PerGroup(16), intx_choose_qparams_algorithm="hqq_scale_only"))
    return [(m.weight.qdata.clone(), m.weight.scale.clone()) for m in model]


def test_cached_quantization_equals_computed(tmp_path):
    reference = _quantize_linears(0)
    path = tmp_path / "q.pt"
    first = HqqCache(path)
    with first.active():
        computed = _quantize_linears(0)
    assert (first.hits, first.misses) == (0, 2)
    assert all(torch.equal(q, rq) and torch.equal(s, rs) for (q, s), (rq, rs) in zip(computed, reference))
    assert first.save() and path.is_file()
    assert not first.save()  # written once
    assert _hqq().__name__ == quant_cache.HQQ_FUNCTION  # restored after the block

    second = HqqCache(path)
    with second.active():
        replayed = _quantize_linears(0)
    assert second.misses == 0 and second.hits == 2
    for (q, s), (rq, rs) in zip(replayed, reference):
        assert q.dtype == rq.dtype and torch.equal(q, rq)
        assert s.dtype == rs.dtype and torch.equal(s, rs)
    assert not second.save()  # nothing new to write

    # Other weights miss: the key is the content, not the call order.
    third = HqqCache(path)
    with third.active():
        other = _quantize_linears(1)
    assert third.misses == 2 and third.hits == 0
    assert not all(torch.equal(q, rq) for (q, _), (rq, _) in zip(other, reference))


def test_unreadable_cache_is_recomputed(tmp_path, capsys):
    path = tmp_path / "q.pt"
    path.write_bytes(b"not a torch file")
    cache = HqqCache(path)
    with cache.active():
        _quantize_linears(0)
    assert cache.misses == 2 and "ignoring" in capsys.readouterr().out


def test_cache_file_keys(tmp_path):
    spec = get_spec("qwen2.5-coder-0.5b")
    base = resolve_options(spec.name, max_seq_len=2048)
    path = cache_file(spec, base, "abc", root=tmp_path)
    assert path.parent == tmp_path / "quant" / spec.name
    assert cache_file(spec, dataclasses.replace(base, max_seq_len=32768), "abc", root=tmp_path) == path
    assert cache_file(spec, base, "abd", root=tmp_path) != path
    assert cache_file(spec, dataclasses.replace(base, embedding_quantize="none"), "abc", root=tmp_path) != path
    assert cache_file(spec, dataclasses.replace(base, quantize="none"), "abc", root=tmp_path) != path


def test_new_results_spill_to_shards_and_save_from_them(tmp_path, monkeypatch):
    """A 7B's new results (4.7 GB) are not held in RAM until the stage ends: past SPILL_BYTES they
    go to shard files, mapped back; save writes them all and removes the shards."""
    monkeypatch.setattr(quant_cache, "SPILL_BYTES", 1)  # every result spills
    reference = _quantize_linears(0)
    path = tmp_path / "q.pt"
    first = HqqCache(path)
    with first.active():
        _quantize_linears(0)
    assert not first.new and len(first.spilled) == 2 and len(list(tmp_path.glob(".q.pt.*.shard*"))) == 2
    assert first.save() and not list(tmp_path.glob(".q.pt.*.shard*"))
    assert not (first.entries or first.new or first.spilled)  # nothing held after saving
    second = HqqCache(path)
    with second.active():
        replayed = _quantize_linears(0)
    assert (second.hits, second.misses) == (2, 0)
    assert all(torch.equal(q, rq) and torch.equal(s, rs) for (q, s), (rq, rs) in zip(replayed, reference))


def test_a_cache_without_a_file_keeps_nothing():
    cache = HqqCache(None)
    with cache.active():
        _quantize_linears(0)
    assert cache.misses == 2 and not cache.new and not cache.spilled
