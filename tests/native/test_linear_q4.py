"""etserve::linear_q4 (native/src/linear_q4.cpp): the 4-bit linear kernel against the numpy
reference of app/models/linear_q4.py, through libetserve_test.so (the runtime's kernel registry,
called boxed as a loaded program calls it), at the shapes the models run (one row: decode; many:
prefill), with and without bias, and its refusals.

    make -C native && pytest tests/native/test_linear_q4.py
"""

import ctypes
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from app.models import linear_q4 as lq

ROOT = Path(__file__).resolve().parents[2]
F32P = ctypes.POINTER(ctypes.c_float)
U8P = ctypes.POINTER(ctypes.c_uint8)
I16P = ctypes.POINTER(ctypes.c_int16)
c_int = ctypes.c_int


@pytest.fixture(scope="module")
def lib(etserve_test_lib):
    L = etserve_test_lib
    L.etserve_test_linear_q4.argtypes = [F32P, c_int, c_int, U8P, I16P, F32P, F32P, c_int, F32P, c_int]
    L.etserve_test_linear_q4.restype = c_int
    return L


def f32(a):
    return None if a is None else a.ctypes.data_as(F32P)


def make_layer(rng, n, k, bias=False):
    q = rng.integers(-8, 8, size=(n, k)).astype(np.int8)
    scales = (rng.random((n, k // 32)) * 0.02 + 0.001).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    return q, scales, b


def run(lib, x, weight, scales, row_sums, bias, out_n=None):
    m, k = x.shape
    n = weight.shape[0]
    out_n = n if out_n is None else out_n
    out = np.full((m, out_n), np.nan, dtype=np.float32)
    rc = lib.etserve_test_linear_q4(f32(x), m, k, weight.ctypes.data_as(U8P), scales.ctypes.data_as(I16P), f32(row_sums),
                                    f32(bias), n, f32(out), out_n)
    return rc, out.reshape(-1)[: m * n].reshape(m, n)


def bound(x, q, scales):
    """The float rounding the kernel may add: a few float32 ulps of the largest partial sums it
    forms (activation bytes up to 255 times |w| times the group scale)."""
    _, s, _ = lq.quantize_rows(x)
    mag = (np.abs(q).astype(np.float64) * np.repeat(scales, 32, axis=1)).sum(-1) * 255
    return 4e-6 * s * mag[None, :]


def test_pack_round_trips_and_sums_rows():
    rng = np.random.default_rng(0)
    q, scales, _ = make_layer(rng, 8, 96)
    weight, s, row_sums = lq.pack(q, scales)
    assert weight.shape == (8, 48) and weight.dtype == np.uint8 and s.dtype == np.int16
    back, s_back = lq.unpack(weight, s)
    np.testing.assert_array_equal(back, q)
    np.testing.assert_array_equal(s_back, scales.astype(np.float16).astype(np.float32))
    # row 1's group 0 is the second 16 bytes: byte j = w[j] + 8 low, w[j + 16] + 8 high
    assert int(weight.reshape(-1)[16]) == (int(q[1, 0]) + 8) | ((int(q[1, 16]) + 8) << 4)
    # row 0's group 1 follows the block's four rows of group 0
    assert int(weight.reshape(-1)[64]) == (int(q[0, 32]) + 8) | ((int(q[0, 48]) + 8) << 4)
    assert s.reshape(-1)[5] == scales[1:2, 1:2].astype(np.float16).view(np.int16)[0, 0]
    expect = (scales.astype(np.float16).astype(np.float64) * q.reshape(8, 3, 32).sum(-1)).sum(-1)
    np.testing.assert_allclose(row_sums, expect, rtol=1e-6)
    with pytest.raises(ValueError):  # out of the int4 range
        lq.pack(np.full((4, 32), 8, np.int8), scales[:4, :1])
    with pytest.raises(ValueError):  # K not in groups of 32
        lq.pack(np.zeros((4, 40), np.int8), np.ones((4, 1), np.float32))
    with pytest.raises(ValueError):  # N not in blocks of 4
        lq.pack(np.zeros((6, 32), np.int8), np.ones((6, 1), np.float32))


def test_the_reference_is_torchaos_arithmetic():
    """quantize_rows is torchao's per-token int8 quantization: its dequantized rows are within half
    a step of x, and the zero maps to an integer."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 64)) * [[0.1], [1], [10], [100], [1e-3]]).astype(np.float32)
    q, s, zp = lq.quantize_rows(x)
    assert q.min() >= -128 and q.max() <= 127
    assert np.all(np.abs((q - zp) * s - x) <= s * 0.5 + 1e-6 * np.abs(x))


@pytest.mark.parametrize("m,k,n,bias", [
    (1, 64, 4, False),       # one row, one block
    (1, 896, 896, True),     # decode: Qwen's q projection
    (1, 4864, 20, False),    # decode: a down projection's width
    (2, 128, 8, True),       # two rows: the paired path
    (7, 160, 36, True),      # prefill: two panels of 16 rows and a block of 4; rows 4 + 1 + 1 + 1
    (13, 160, 36, False),    # rows 8 (AVX-512) + 4 + 1
    (64, 896, 40, False),    # a prefill chunk
    (6, 4864, 20, True),     # a down projection's width: a panel and a block; 4 + 1 + 1 rows
    (3, 64, 8, False),       # no panel: blocks of 4 alone
    # with AMX: 16 rows a tile, the rest as without it
    (16, 160, 32, True),     # one tile of rows, groups 4 + 1
    (37, 896, 52, False),    # two tiles of rows and 5 more (4 + 1); three panels and a block
    (128, 4864, 48, True),   # a whole prefill chunk over a down projection's width
])
def test_matches_the_reference(lib, m, k, n, bias):
    rng = np.random.default_rng(m * 1000 + n)
    q, scales, b = make_layer(rng, n, k, bias)
    weight, s, row_sums = lq.pack(q, scales)
    x = (rng.standard_normal((m, k)) * rng.random((m, 1)) * 3).astype(np.float32)
    x[0, 0] = 7.5  # an outlier, as activations have
    rc, y = run(lib, x, weight, s, row_sums, b)
    assert rc == 0
    ref = lq.reference(x, weight, s, b)
    err = np.abs(y - ref)
    assert np.all(err <= bound(x, q, scales) + 1e-6), err.max()


def test_rows_quantize_independently(lib):
    """Each activation row has its own scale: a row of tiny values next to one of huge values
    keeps its precision."""
    rng = np.random.default_rng(3)
    q, scales, _ = make_layer(rng, 8, 64)
    weight, s, row_sums = lq.pack(q, scales)
    x = np.stack([rng.standard_normal(64) * 1e-3, rng.standard_normal(64) * 1e3,
                  np.zeros(64)]).astype(np.float32)
    rc, y = run(lib, x, weight, s, row_sums, None)
    assert rc == 0
    exact = x.astype(np.float64) @ (q * np.repeat(scales, 32, axis=1)).T.astype(np.float64)
    for row in range(2):
        assert np.abs(y[row] - exact[row]).max() <= 0.02 * np.abs(exact[row]).max()
    np.testing.assert_array_equal(y[2], np.zeros(8, np.float32))


def test_out_is_resized_to_n(lib):
    rng = np.random.default_rng(4)
    q, scales, _ = make_layer(rng, 8, 64)
    weight, s, row_sums = lq.pack(q, scales)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    rc, y = run(lib, x, weight, s, row_sums, None, out_n=11)
    assert rc == 0
    np.testing.assert_allclose(y, lq.reference(x, weight, s), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k,n", [(48, 4), (64, 6)])
def test_refuses_shapes_it_does_not_hold(lib, k, n):
    """K must come in groups of 32, N in blocks of 4: refused with an error, not computed."""
    x = np.ones((1, k), np.float32)
    weight = np.zeros((n, k // 2), np.uint8)
    scales = np.ones((n, max(1, k // 32)), np.int16)
    out = np.zeros((1, n), np.float32)
    rc = lib.etserve_test_linear_q4(f32(x), 1, k, weight.ctypes.data_as(U8P), scales.ctypes.data_as(I16P),
                                    f32(np.zeros(n, np.float32)), None, n, f32(out), n)
    assert rc != 0


# ---------------------------------------------------------------------------
# End to end: a tiny model quantized by torchao's 8da4w transform, its linears swapped for
# etserve::linear_q4 (app.models.linear_q4.use_native_linears), exported to .pte (in a subprocess:
# torch and the wheel's kernels stay out of the test process), run by our runtime and compared
# with the quantized model run eagerly by torchao.

EXPORT_SCRIPT = textwrap.dedent(r'''
    import json, sys
    import numpy as np
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup
    from executorch.exir import to_edge_transform_and_lower, EdgeCompileConfig
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from app.models.linear_q4 import use_native_linears

    out_dir = sys.argv[1]
    VOCAB, DIM, HID = 80, 64, 96

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(VOCAB, DIM)
            self.up = torch.nn.Linear(DIM, HID, bias=True)
            self.down = torch.nn.Linear(HID, DIM, bias=False)
            self.out = torch.nn.Linear(DIM, VOCAB, bias=False)

        def forward(self, tokens, input_pos):
            x = self.emb(tokens)
            x = x + self.down(torch.nn.functional.silu(self.up(x)))
            return self.out(x[:, -1, :])

    torch.manual_seed(0)
    model = Tiny().eval()
    quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4,
              weight_granularity=PerGroup(32)), filter_fn=lambda m, fqn: fqn in ("up", "down"))
    for lin in (model.up, model.down):  # the operator keeps float16 scales: the same ones here
        lin.weight.scale.copy_(lin.weight.scale.half().float())
    rng = np.random.default_rng(0)
    steps = [(0, rng.integers(0, VOCAB, 7).tolist()), (7, [3]), (8, rng.integers(0, VOCAB, 12).tolist())]
    with torch.no_grad():
        logits = [model(torch.tensor([t]), torch.tensor([p])).numpy()[0] for p, t in steps]
    swapped = use_native_linears(model)
    seq = torch.export.Dim("seq", min=1, max=31)
    with torch.no_grad():
        ep = torch.export.export(model, (torch.zeros(1, 2, dtype=torch.long), torch.tensor([0])),
                                 dynamic_shapes=({1: seq}, None), strict=False)
    edge = to_edge_transform_and_lower(
        ep, partitioner=[XnnpackPartitioner()],
        compile_config=EdgeCompileConfig(_check_ir_validity=False),
        constant_methods={"get_max_seq_len": 32, "get_vocab_size": VOCAB, "use_kv_cache": True,
                          "enable_dynamic_shape": True, "get_eos_ids": [1]})
    prog = edge.to_executorch()
    with open(out_dir + "/tiny.pte", "wb") as f:
        f.write(prog.buffer)
    ops = sorted({str(op.name) + "." + str(op.overload) for plan in
                  prog.executorch_program.execution_plan for op in plan.operators})
    np.save(out_dir + "/logits.npy", np.stack(logits))
    with open(out_dir + "/steps.json", "w") as f:
        json.dump({"steps": steps, "ops": ops, "swapped": swapped}, f)
''')


@pytest.fixture(scope="module")
def tiny_q4_pte(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("tiny_linear_q4")
    proc = subprocess.run([sys.executable, "-c", EXPORT_SCRIPT, str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail("export failed:\n" + proc.stderr[-4000:])
    meta = json.loads((out / "steps.json").read_text())
    return out / "tiny.pte", meta, np.load(out / "logits.npy")


def test_an_exported_8da4w_model_runs_its_linears_in_our_kernel(run_pte, tiny_q4_pte):
    path, meta, ref_logits = tiny_q4_pte
    assert meta["swapped"] == 2
    assert "etserve::linear_q4.out" in meta["ops"]
    got = run_pte(path, meta["steps"], ref_logits.shape[1])
    for start, g, ref in zip([s for s, _ in meta["steps"]], got, ref_logits):
        # torchao's eager arithmetic, up to float summation order
        assert np.abs(g - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max()), (start, np.abs(g - ref).max())


@pytest.mark.parametrize("n,k", [(64, 128), (896, 4864), (52, 96)])  # 52: blocks past the last panel
def test_a_row_is_the_same_bit_for_bit_however_many_rows_the_call_has(lib, n, k):
    """A decode step (one row: gemv) and the same row in a call of several (panels, AMX tiles from
    16 rows, the blocks past the last panel) round alike: batched decode and speculative drafts
    give the outputs of plain decoding (app/engine/batching.py)."""
    rng = np.random.default_rng(n + k)
    q, scales, b = make_layer(rng, n, k, bias=True)
    weight, s, row_sums = lq.pack(q, scales)
    x = (rng.standard_normal((20, k)) * 3).astype(np.float32)
    singles = np.stack([run(lib, x[i : i + 1], weight, s, row_sums, b)[1][0] for i in range(20)])
    for m in (2, 4, 5, 7, 8, 9, 16, 20):  # 5-7: two gemv passes over chunks of blocks
        rc, y = run(lib, x[:m], weight, s, row_sums, b)
        assert rc == 0
        np.testing.assert_array_equal(y, singles[:m], err_msg=f"{m} rows")
