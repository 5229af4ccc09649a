"""Giving a slot's KV memory back (ets_kv_slot_trim, ets_kv_slot_memory) on the real models: the
test model's fp32 caches and the default model's int8 ones (which the AMX kernel keeps in its
tiled layout, kv_layout.h). What a slot keeps must be untouched: a continuation computed after a
cut, over the positions kept, gives the logits it gave before, bit for bit."""

from __future__ import annotations

import pytest

from app.engine import NativeError, NativeModel


@pytest.fixture(scope="module", params=["test model", "default model"])
def model(request, model_dir, qwen_dir):
    m = NativeModel((model_dir if request.param == "test model" else qwen_dir) / "model.pte")
    try:
        m.forward([1], 0)  # the caches are found on a first call
        m.set_slots(2)
        yield m
    finally:
        m.close()


def fill(m: NativeModel, ids: list[int], start: int) -> list[float]:
    """ids[start:] into the selected slot from position `start`: a prefill chunk up to 10 tokens
    before the end (in chunks of 128 from `start`, a multiple of 64), then decode steps (the
    steps that read an int8 cache in the AMX layout); the logits after the last."""
    end = len(ids) - 10
    for pos in range(start, end, 128):
        m.forward(ids[pos:min(pos + 128, end)], pos)
    for pos in range(end, len(ids)):
        m.forward([ids[pos]], pos)
    return list(m.logits())


@pytest.mark.parametrize("slot", [0, 1])
def test_a_cut_gives_memory_back_and_keeps_the_positions_before_it(model, slot):
    bpp = model.kv_info().bytes_per_position
    ids = [(i * 7919) % 5000 + 100 for i in range(300)]
    model.select_slot(slot)
    before = fill(model, ids, 0)
    reserved, full = model.slot_memory(slot)
    assert reserved >= bpp * model.info.max_seq_len
    assert full >= 280 * bpp, (full, bpp)

    model.trim_slot(slot, 128)
    _, cut = model.slot_memory(slot)
    assert cut <= full - 100 * bpp, (full, cut, bpp)  # ~172 of 300 positions gone
    with pytest.raises(NativeError):
        model.logits()  # the selected slot changed under them

    assert fill(model, ids, 128) == before  # positions 0..127 as they were

    model.trim_slot(slot, 0)
    _, empty = model.slot_memory(slot)
    assert empty < full // 4
    model.select_slot(0)


def test_bad_cuts_are_refused(model):
    with pytest.raises(NativeError):
        model.trim_slot(2, 0)
    with pytest.raises(NativeError):
        model.trim_slot(1, -1)
