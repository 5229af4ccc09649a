"""The AVX2 tier keeps the real model's int8 KV caches in kv_layout.h's tiles (llm_kernels.cpp):
its decode kernel reads them as they are (attention_decode.cpp), the generic tile copies a
block's rows out of them for prefill chunks, update_cache writes new rows into them, and the
snapshots of sessions hold rows. Everything a model does over them must come out bit for bit as
over caches in rows ($ETSERVE_ATTENTION=generic keeps them there): prefill in chunks (the second
attending over what the first wrote), greedy decode steps across 64-position blocks, and a
snapshot restored after other tokens overwrote the rows, the prompt copied into a slot no
attention has read, holding no more memory than its positions. The kernels alone, on every tier, are
kernel_check's tiled cases (tests/native/test_kernel_check.py)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import sys
import numpy as np
from app.engine import NativeModel

model = NativeModel(sys.argv[1] + "/model.pte")
ids = [int(x) for x in sys.argv[3].split(",")]
out = []
def logits():
    out.append(np.frombuffer(model.logits(), dtype=np.float32).copy())
model.forward(ids[:512], 0)
model.forward(ids[512:], 512)  # a second prefill chunk over the first one's rows
logits()
pos, tok = len(ids), int(out[-1].argmax())
for _ in range(12):  # greedy steps across the block boundary at 704
    model.forward([tok], pos)
    logits()
    pos, tok = pos + 1, int(out[-1].argmax())
snap = model.kv_snapshot(pos)
model.forward([tok], pos)
logits()
model.forward(ids[:300], 400)  # other tokens overwrite rows 400..699
model.kv_restore(pos, snap)
model.forward([tok], pos)
logits()
# a second slot, made after the first attention and read by none: the prompt copied into it
# from slot 0, whatever layout each holds, then the same step there
model.set_slots(3)
model.copy_slot(0, 2, len(ids))
model.select_slot(2)
model.forward([ids[-1]], len(ids) - 1)
logits()
model.forward([int(out[-1].argmax())], len(ids))
logits()
model.select_slot(0)  # the same step in the slot copied from
model.forward([ids[-1]], len(ids) - 1)
logits()
# what a slot holds in memory is the positions written, not a whole converted cache
print("resident", model.slot_memory(1)[1], model.slot_memory(2)[1], *reversed(model.slot_memory(0)), flush=True)
np.save(sys.argv[2], np.stack(out))
"""


def _flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.split(":")[0].strip() == "flags":
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.fixture(scope="module")
def int8_dir(qwen_dir) -> Path:
    if platform.machine() != "x86_64" or not {"avx2", "fma", "f16c", "bmi2", "movbe"} <= _flags():
        pytest.skip("needs an x86-64 CPU with the avx2 tier")
    if json.loads((qwen_dir / "etserve.json").read_text()).get("kv_cache") != "int8":
        pytest.skip(f"{qwen_dir} has no int8 KV cache")
    return qwen_dir


def _run(directory: Path, ids: list[int], out: Path, **env: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory), str(out), ",".join(map(str, ids))], cwd=ROOT,
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "ETSERVE_ISA": "avx2", "ETSERVE_NATIVE_LOG_LEVEL": "1", **env})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stderr + proc.stdout


def test_the_avx2_tier_over_tiled_caches_matches_rows_bit_for_bit(int8_dir, tmp_path):
    rng = np.random.default_rng(5)
    ids = rng.integers(1000, 30000, 700).tolist()
    tiled_log = _run(int8_dir, ids, tmp_path / "tiled.npy")
    rows_log = _run(int8_dir, ids, tmp_path / "rows.npy", ETSERVE_ATTENTION="generic")
    # every layer's key and value caches went to tiles at the first forward call, and only there
    assert tiled_log.count("int8 KV cache of") == 48 and tiled_log.count("to tiles") == 48, tiled_log[-3000:]
    assert "int8 KV cache of" not in rows_log, rows_log[-3000:]
    tiled, rows = np.load(tmp_path / "tiled.npy"), np.load(tmp_path / "rows.npy")
    assert tiled.shape == rows.shape == (18, tiled.shape[1])
    assert np.array_equal(tiled[-4], tiled[-5])  # the restored snapshot gives the same step
    assert np.array_equal(tiled[-3], tiled[-1])  # the copied slot reads what its source reads
    assert np.array_equal(tiled, rows)
    # slot 1 untouched; slot 2 holds ~700 positions' pages; slot 0 (the program's memory, in huge
    # pages: 2 MB of each cache at least) what those positions touched, not every page of its
    # caches, which converting them whole made resident (measured 116 MB and 217 MB of 217 MB)
    for log in (tiled_log, rows_log):
        untouched, copied, program, reserved = (int(x) for x in log.split("resident ")[1].split()[:4])
        assert untouched == 0 and copied < 2 * 704 * (24 * 2 * 2 * (64 + 4 + 1)), log[-2000:]
        assert program < 0.75 * reserved, log[-2000:]
