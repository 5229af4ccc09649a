"""Tests of etserve's own kernels for ExecuTorch's LLM custom operators
(native/src/llm_kernels.cpp, attention.cpp, registered by llm_ops.cpp): against
plain numpy references through the C test entry points of libetserve_test.so,
which call them through the runtime's kernel registry, and end to end through a real .pte that calls
llama::update_cache / llama::custom_sdpa, run by our library.

    make -C native && pytest tests/native/test_llm_ops.py
"""

import ctypes
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

F32P = ctypes.POINTER(ctypes.c_float)
c_int = ctypes.c_int
c_i64 = ctypes.c_int64


@pytest.fixture(scope="module")
def lib(etserve_test_lib):
    L = etserve_test_lib
    L.etserve_test_custom_sdpa.argtypes = [
        F32P, c_int, c_int, c_int, c_int, F32P, F32P, c_int, c_int, c_i64,
        c_int, F32P, ctypes.c_float, F32P,
    ]
    L.etserve_test_custom_sdpa.restype = c_int
    L.etserve_test_update_cache.argtypes = [
        F32P, c_int, c_int, c_int, c_int, F32P, c_int, c_i64,
    ]
    L.etserve_test_update_cache.restype = c_int
    L.etserve_test_sdpa_with_kv_cache.argtypes = [
        F32P, F32P, F32P, c_int, c_int, c_int, c_int, F32P, F32P, c_int, c_int,
        c_i64, c_int, F32P, ctypes.c_float, F32P,
    ]
    L.etserve_test_sdpa_with_kv_cache.restype = c_int
    I8P = ctypes.POINTER(ctypes.c_int8)
    L.etserve_test_custom_quantized_sdpa.argtypes = [
        I8P, F32P, I8P, c_int, c_int, c_int, c_int, I8P, F32P, I8P, I8P, F32P, I8P,
        c_int, c_int, c_i64, c_int, F32P, ctypes.c_float, F32P,
    ]
    L.etserve_test_custom_quantized_sdpa.restype = c_int
    L.etserve_test_update_cache_typed.argtypes = [
        c_int, ctypes.c_void_p, c_int, c_int, c_int, c_int, ctypes.c_void_p, c_int, c_i64,
    ]
    L.etserve_test_update_cache_typed.restype = c_int
    L.etserve_test_custom_sdpa_dtype.argtypes = [c_int]
    L.etserve_test_custom_sdpa_dtype.restype = c_int
    L.etserve_llm_op_count.restype = c_int
    L.etserve_llm_op_name.argtypes = [c_int]
    L.etserve_llm_op_name.restype = ctypes.c_char_p
    L.etserve_llm_ops_registered.restype = c_int
    return L


def ptr(a):
    if a is None:
        return None
    assert a.dtype == np.float32 and a.flags["C_CONTIGUOUS"]
    return a.ctypes.data_as(F32P)


def ref_sdpa(q, kc, vc, start_pos, causal, mask=None, scale=None):
    """Plain loops in float64: q [B,S,H,D], caches [B,Smax,Hkv,D]."""
    B, S, H, D = q.shape
    Smax, Hkv = kc.shape[1], kc.shape[2]
    group = H // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = np.zeros(q.shape, np.float64)
    for b in range(B):
        for i in range(S):
            n = Smax if mask is not None else start_pos + S
            if causal:
                n = min(n, start_pos + i + 1)
            for h in range(H):
                g = h // group
                k = kc[b, :n, g, :].astype(np.float64)
                v = vc[b, :n, g, :].astype(np.float64)
                s = k @ q[b, i, h].astype(np.float64) * scale
                if mask is not None:
                    s = s + mask[i, :n]
                s = np.exp(s - s.max())
                out[b, i, h] = (s / s.sum()) @ v
    return out


def ref_sdpa_8bit_weights(q, k, v, start_pos, causal, mask=None, levels=255):
    """ref_sdpa for one query row (S == 1) as attention_decode.cpp's AVX-512 VNNI kernel
    (levels 255) or AVX2 kernel (127) rounds it: per head and 64-key block (from key 0), the
    weights p * v_scale as multiples of 1/levels of the block's largest, rounded to nearest;
    the values' sum and the weights' sum (p as rounded) both from those. k, v: `_quantized`
    tuples (v's raw int8, scales, zero points are used as the kernel uses them)."""
    qf, kf = q[3], k[3]
    v8, vs, vz = v[0].astype(np.float64), v[1].astype(np.float64)[..., 0], v[2].astype(np.float64)[..., 0]
    B, S, H, D = qf.shape
    assert S == 1
    Smax, Hkv = kf.shape[1], kf.shape[2]
    group = H // Hkv
    out = np.zeros(qf.shape, np.float64)
    n = Smax if mask is not None else start_pos + 1
    if causal:
        n = min(n, start_pos + 1)
    for b in range(B):
        for h in range(H):
            g = h // group
            s = kf[b, :n, g] @ qf[b, 0, h] / math.sqrt(D)
            if mask is not None:
                s = s + mask[0, :n]
            if not np.isfinite(s.max()):
                continue  # nothing visible: zeros
            w = np.exp(s - s.max()) * vs[b, :n, g]
            wq = np.zeros(n)
            for j in range(0, n, 64):
                top = w[j:j + 64].max()
                if top > 0:
                    wq[j:j + 64] = np.minimum(np.round(w[j:j + 64] / top * levels), levels) * top / levels
            out[b, 0, h] = (wq @ (v8[b, :n, g] - vz[b, :n, g, None])) / (wq / vs[b, :n, g]).sum()
    return out


def run_custom_sdpa(lib, q, kc, vc, start_pos, causal, mask=None, scale=None):
    B, S, H, D = q.shape
    Smax, Hkv = kc.shape[1], kc.shape[2]
    out = np.full(q.shape, np.nan, np.float32)
    rc = lib.etserve_test_custom_sdpa(
        ptr(q), B, S, H, D, ptr(kc), ptr(vc), Smax, Hkv, start_pos, int(causal),
        ptr(mask), -1.0 if scale is None else scale, ptr(out),
    )
    return rc, out


# (B, S, H, Hkv, D, Smax, start_pos): GQA ratios 1, 3, 7; start_pos at 0,
# in the middle and at the end of the cache; seq_len 1 and > 1; head dims
# that hit every vector tail (8, 13, 64, 72, 96, 128).
SHAPES = [
    (1, 1, 4, 4, 64, 64, 0),
    (1, 1, 4, 4, 64, 64, 30),
    (1, 1, 4, 4, 64, 64, 63),
    (1, 7, 4, 4, 64, 64, 0),
    (1, 7, 4, 4, 64, 64, 21),
    (1, 7, 4, 4, 64, 64, 57),
    (1, 1, 9, 3, 64, 128, 0),
    (1, 1, 9, 3, 64, 128, 77),
    (1, 1, 9, 3, 64, 128, 127),
    (1, 33, 9, 3, 64, 128, 0),
    (1, 33, 9, 3, 64, 128, 50),
    (1, 33, 9, 3, 64, 128, 95),
    (2, 5, 14, 2, 8, 40, 0),
    (2, 5, 14, 2, 8, 40, 17),
    (2, 5, 14, 2, 8, 40, 35),
    (1, 1, 7, 1, 13, 23, 0),
    (1, 1, 7, 1, 13, 23, 11),
    (1, 1, 7, 1, 13, 23, 22),
    (1, 4, 7, 1, 13, 23, 19),
    (2, 3, 6, 2, 72, 50, 9),
    (1, 2, 3, 1, 96, 300, 298),
    (1, 1, 2, 1, 128, 512, 449),
    (1, 64, 14, 2, 64, 96, 0),
]


def _rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B%d_S%d_H%d_Hkv%d_D%d_Smax%d_pos%d" % s)
def test_custom_sdpa_matches_reference(lib, shape, causal):
    B, S, H, Hkv, D, Smax, start_pos = shape
    rng = np.random.default_rng(hash(shape) % 2**32)
    q = _rand(rng, B, S, H, D)
    kc = _rand(rng, B, Smax, Hkv, D)
    vc = _rand(rng, B, Smax, Hkv, D)
    rc, out = run_custom_sdpa(lib, q, kc, vc, start_pos, causal)
    assert rc == 0
    ref = ref_sdpa(q, kc, vc, start_pos, causal)
    assert np.abs(out - ref).max() <= 1e-4


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", [
    (1, 1, 9, 3, 64, 512, 449), (1, 1, 14, 2, 64, 600, 300), (1, 1, 4, 1, 128, 1024, 900),
    (1, 2, 9, 3, 64, 512, 200), (1, 8, 9, 3, 64, 512, 100),
], ids=lambda s: "B%d_S%d_H%d_Hkv%d_D%d_Smax%d_pos%d" % s)
def test_custom_sdpa_thread_counts(lib, shape, threads):
    """Decode splits the keys over threads when there are few (row, kv head)
    groups; the merged result must not depend on the split."""
    if not hasattr(lib, "ets_set_num_threads"):
        pytest.skip("library has no ets_set_num_threads")
    lib.ets_set_num_threads.argtypes = [c_int]
    lib.ets_get_num_threads.restype = c_int
    before = lib.ets_get_num_threads()
    B, S, H, Hkv, D, Smax, start_pos = shape
    rng = np.random.default_rng(threads)
    q = _rand(rng, B, S, H, D)
    kc = _rand(rng, B, Smax, Hkv, D)
    vc = _rand(rng, B, Smax, Hkv, D)
    try:
        assert lib.ets_set_num_threads(threads) == 0
        rc, out = run_custom_sdpa(lib, q, kc, vc, start_pos, True)
    finally:
        lib.ets_set_num_threads(before)
    assert rc == 0
    assert np.abs(out - ref_sdpa(q, kc, vc, start_pos, True)).max() <= 1e-4


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_custom_sdpa_mask_with_key_split(lib, threads):
    """Decode with a mask over a long cache: whole key chunks are masked out."""
    if not hasattr(lib, "ets_set_num_threads"):
        pytest.skip("library has no ets_set_num_threads")
    lib.ets_set_num_threads.argtypes = [c_int]
    lib.ets_get_num_threads.restype = c_int
    before = lib.ets_get_num_threads()
    rng = np.random.default_rng(5)
    B, S, H, Hkv, D, Smax = 1, 1, 9, 3, 64, 1024
    q = _rand(rng, B, S, H, D)
    kc = _rand(rng, B, Smax, Hkv, D)
    vc = _rand(rng, B, Smax, Hkv, D)
    mask = np.full((S, Smax), -np.inf, np.float32)
    mask[0, :100] = 0.0
    mask[0, 700:705] = 0.25
    try:
        assert lib.ets_set_num_threads(threads) == 0
        rc, out = run_custom_sdpa(lib, q, kc, vc, 0, False, mask=mask)
    finally:
        lib.ets_set_num_threads(before)
    assert rc == 0
    assert np.abs(out - ref_sdpa(q, kc, vc, 0, False, mask=mask)).max() <= 1e-4


@pytest.mark.parametrize("shape", SHAPES[::2], ids=lambda s: "B%d_S%d_H%d_Hkv%d_D%d_Smax%d_pos%d" % s)
def test_custom_sdpa_with_mask(lib, shape):
    """The exporter's mask path: start_pos 0, is_causal False, an additive
    [S, Smax] mask (causal -inf triangle from start_pos) over all cache rows."""
    B, S, H, Hkv, D, Smax, start_pos = shape
    rng = np.random.default_rng(1 + hash(shape) % 2**32)
    q = _rand(rng, B, S, H, D)
    kc = _rand(rng, B, Smax, Hkv, D)
    vc = _rand(rng, B, Smax, Hkv, D)
    mask = np.zeros((S, Smax), np.float32)
    for i in range(S):
        mask[i, start_pos + i + 1:] = -np.inf
    mask += _rand(rng, S, Smax, scale=0.5)  # arbitrary additive part too
    rc, out = run_custom_sdpa(lib, q, kc, vc, 0, False, mask=mask)
    assert rc == 0
    ref = ref_sdpa(q, kc, vc, 0, False, mask=mask)
    assert np.abs(out - ref).max() <= 1e-4
    # Equivalent to the causal path when the mask is the plain triangle.
    tri = np.zeros((S, Smax), np.float32)
    for i in range(S):
        tri[i, start_pos + i + 1:] = -np.inf
    rc, out_m = run_custom_sdpa(lib, q, kc, vc, 0, False, mask=tri)
    rc2, out_c = run_custom_sdpa(lib, q, kc, vc, start_pos, True)
    assert rc == 0 and rc2 == 0
    assert np.abs(out_m - out_c).max() <= 1e-5


def test_custom_sdpa_explicit_scale_and_large_scores(lib):
    rng = np.random.default_rng(7)
    B, S, H, Hkv, D, Smax, start_pos = 1, 3, 6, 2, 32, 50, 20
    q = _rand(rng, B, S, H, D, scale=8.0)  # logits in the hundreds: stability
    kc = _rand(rng, B, Smax, Hkv, D, scale=8.0)
    vc = _rand(rng, B, Smax, Hkv, D)
    for scale in (0.05, 0.5):
        rc, out = run_custom_sdpa(lib, q, kc, vc, start_pos, True, scale=scale)
        assert rc == 0
        assert np.isfinite(out).all()
        assert np.abs(out - ref_sdpa(q, kc, vc, start_pos, True, scale=scale)).max() <= 1e-4


def test_custom_sdpa_refuses_bad_input(lib):
    rng = np.random.default_rng(3)
    q = _rand(rng, 1, 4, 4, 16)
    kc = _rand(rng, 1, 10, 2, 16)
    vc = _rand(rng, 1, 10, 2, 16)
    # start_pos + seq_len past the cache
    assert run_custom_sdpa(lib, q, kc, vc, 7, True)[0] != 0
    assert run_custom_sdpa(lib, q, kc, vc, -1, True)[0] != 0
    # mask together with is_causal
    mask = np.zeros((4, 10), np.float32)
    assert run_custom_sdpa(lib, q, kc, vc, 0, True, mask=mask)[0] != 0
    # heads not a multiple of kv heads
    q3 = _rand(rng, 1, 4, 3, 16)
    assert run_custom_sdpa(lib, q3, kc, vc, 0, True)[0] != 0


@pytest.mark.parametrize("dtype", [5, 15], ids=["Half", "BFloat16"])
def test_custom_sdpa_refuses_half_types(lib, dtype):
    assert lib.etserve_test_custom_sdpa_dtype(dtype) != 0
    assert lib.etserve_test_custom_sdpa_dtype(6) == 0  # Float works


@pytest.mark.parametrize("B,S,Hkv,D,Smax,start_pos", [
    (1, 1, 3, 64, 32, 0), (1, 1, 3, 64, 32, 17), (1, 1, 3, 64, 32, 31),
    (2, 5, 2, 8, 20, 0), (2, 5, 2, 8, 20, 9), (2, 5, 2, 8, 20, 15),
])
def test_update_cache_writes_only_new_rows(lib, B, S, Hkv, D, Smax, start_pos):
    rng = np.random.default_rng(start_pos)
    value = _rand(rng, B, S, Hkv, D)
    cache = _rand(rng, B, Smax, Hkv, D)
    before = cache.copy()
    rc = lib.etserve_test_update_cache(ptr(value), B, S, Hkv, D, ptr(cache), Smax, start_pos)
    assert rc == 0
    expect = before.copy()
    expect[:, start_pos:start_pos + S] = value
    assert np.array_equal(cache, expect)


def test_update_cache_refuses_overflow(lib):
    value = np.zeros((1, 4, 2, 8), np.float32)
    cache = np.ones((1, 10, 2, 8), np.float32)
    assert lib.etserve_test_update_cache(ptr(value), 1, 4, 2, 8, ptr(cache), 10, 7) != 0
    assert (cache == 1).all()


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("B,S,H,Hkv,D,Smax,start_pos", [
    (1, 1, 9, 3, 64, 48, 0), (1, 1, 9, 3, 64, 48, 47), (1, 6, 14, 2, 16, 30, 11),
    (2, 3, 4, 4, 13, 12, 9),
])
def test_sdpa_with_kv_cache(lib, causal, B, S, H, Hkv, D, Smax, start_pos):
    rng = np.random.default_rng(11 + start_pos)
    q = _rand(rng, B, S, H, D)
    k = _rand(rng, B, S, Hkv, D)
    v = _rand(rng, B, S, Hkv, D)
    kc = _rand(rng, B, Smax, Hkv, D)
    vc = _rand(rng, B, Smax, Hkv, D)
    kc_ref, vc_ref = kc.copy(), vc.copy()
    kc_ref[:, start_pos:start_pos + S] = k
    vc_ref[:, start_pos:start_pos + S] = v
    out = np.full(q.shape, np.nan, np.float32)
    rc = lib.etserve_test_sdpa_with_kv_cache(
        ptr(q), ptr(k), ptr(v), B, S, H, D, ptr(kc), ptr(vc), Smax, Hkv, start_pos,
        int(causal), None, -1.0, ptr(out))
    assert rc == 0
    assert np.array_equal(kc, kc_ref) and np.array_equal(vc, vc_ref)
    ref = ref_sdpa(q, kc_ref, vc_ref, start_pos, causal)
    assert np.abs(out - ref).max() <= 1e-4


# ---------------------------------------------------------------------------
# int8 operands (ExecuTorch's quantize_kv_cache export): x = (q - zero_point) * scale
# per (batch, position, head).

def _quantized(rng, *shape):
    """Random int8 data with per-(b, s, h) float scales and int8 zero points, and its
    dequantized float64 value."""
    data = rng.integers(-128, 128, shape).astype(np.int8)
    scale = (rng.uniform(0.002, 0.05, shape[:-1] + (1,))).astype(np.float32)
    zp = rng.integers(-20, 20, shape[:-1] + (1,)).astype(np.int8)
    return data, scale, zp, (data.astype(np.float64) - zp) * scale


def int8_tolerance(kernel, S, G, D, isa):
    """The bound on |out - float64 reference| of the int8-cache kernels on `_quantized` data
    (outputs up to ~6): 1e-4, where the weighted sums are fp32; more where they take the
    weights (P times the value scales) as 16-bit fixed point per block, up to 2^-17 of the
    block's largest weight per key:
    - 5e-4 on the AMX kernel over tiled caches, decode and prefill alike (A blocks of at most
      8 query vectors; 128-key blocks, two unsigned digits in one tile);
    - 5e-4 on the generic tile of query rows built for AVX-512 VNNI (attention.cpp, D a
      multiple of 16; measured 3.2e-4 at most, 2026-12-01: a row's weights over a block of
      64 keys, each off by up to 2^-17 of the largest, times values up to 255 steps from
      their zero points).
    Quantizing float keys and values per position the way the cache does moves such outputs
    (~9) by 0.2-0.3, 500 times more.
    The decode kernel built for AVX-512 VNNI or AVX2 (decode_weight_levels) is held to its own
    rounding instead: see expect_int8."""
    if kernel == "amx-tiled":
        return 5e-4
    generic = kernel == "generic" or D != 64  # the AMX tile takes head dim 64 only
    if generic and isa == "avx512-vnni" and D % 16 == 0:
        return 5e-4
    return 1e-4


def decode_weight_levels(kernel, S, G, D, isa):
    """The weight levels of attention_decode.cpp's kernel where these rows run on it (one query
    row, G <= 8, D 64 or 128) and its weighted sums take the weights as fixed point per 64-key
    block: 255 built for AVX-512 VNNI (8 bits, vpdpbusd: up to 2^-9 of the block's largest
    weight per key), 127 built for AVX2 (7 bits, vpmaddubsw: 2^-8); else 0 (float weights). On
    `_quantized` data, whose rows' value scales span a factor of 25 (a row's weight, P times its
    scale, can sit far below the block's largest), 8 bits move outputs by up to 0.26 from the
    float64 reference (measured over 60 seeds, 2026-12-02), as much as the cache's own int8
    rounding of the values, 7 bits up to 0.16 on kernel_check's cases; on the real model
    neither moved anything measurable (perplexity through decode steps, bench/perplexity.py's
    text at 512-token windows: 95.47 with 8 bits against 95.94 with 16; with 7 bits on the
    AVX2 set 97.17 against 97.49 with float weights, and on argparse.py at 4,096-token windows
    3.3135 against 3.3124; test_compact_kv_cache.py within its bounds)."""
    generic = kernel == "generic" or D != 64  # the AMX tile takes head dim 64 only
    if not (generic and S == 1 and G <= 8 and D in (64, 128)):
        return 0
    return {"avx512-vnni": 255, "avx2": 127}.get(isa, 0)


def expect_int8(lib, kernel, out, q, k, v, start_pos, causal, mask=None, relative=None):
    """Asserts out (one call's output on `_quantized` operands) against the float64 reference
    within int8_tolerance, or, on the fixed-point decode kernels (decode_weight_levels), against
    ref_sdpa_8bit_weights, their rounding emulated in float64, within 1e-3 (measured 1.7e-4 at
    most over 60 seeds with 8 bits). With `relative`: within that much of the reference's
    largest magnitude instead (those kernels: 2e-4, measured 4.3e-5 with 8 bits)."""
    S, H, D = q[0].shape[1:]
    G = H // k[0].shape[2]
    levels = decode_weight_levels(kernel, S, G, D, vector_isa(lib))
    if levels:
        ref = ref_sdpa_8bit_weights(q, k, v, start_pos, causal, mask, levels)
        tol = 1e-3 if relative is None else 2e-4 * np.abs(ref).max()
    else:
        ref = ref_sdpa(q[3], k[3], v[3], start_pos, causal, mask=mask)
        tol = int8_tolerance(kernel, S, G, D, vector_isa(lib)) if relative is None else relative * np.abs(ref).max()
    assert np.abs(out - ref).max() <= tol


def vector_isa(lib):
    """What the library was built for (ets_vector_isa)."""
    lib.ets_vector_isa.restype = ctypes.c_char_p
    return lib.ets_vector_isa().decode()


def i8ptr(a):
    assert a.dtype == np.int8 and a.flags["C_CONTIGUOUS"]
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))


@pytest.fixture(params=["generic", "amx", "amx-tiled"])
def int8_kernel(request, lib):
    """Runs an int8-cache test on each attention kernel: the generic one (AVX2; one query row
    at a time on attention_decode.cpp's kernel, more on the generic tile) and, where
    the CPU and OS have them, Intel AMX tiles (ets_attention_kernel), over caches in rows and,
    as in a model's forward call, in the tile layout (kv_layout.h: caches of 64-multiple
    lengths are converted in place by the first call)."""
    lib.ets_attention_kernel.argtypes = [c_int]
    lib.ets_attention_kernel.restype = c_int
    lib.etserve_test_kv_layouts.argtypes = [c_int]
    before = lib.ets_attention_kernel(-1)
    want = {"generic": 0, "amx": 1, "amx-tiled": 1}[request.param]
    if lib.ets_attention_kernel(want) != want:
        pytest.skip("this CPU or OS has no AMX-BF16")
    lib.etserve_test_kv_layouts(int(request.param == "amx-tiled"))
    try:
        yield request.param
    finally:
        lib.etserve_test_kv_layouts(0)
        lib.ets_attention_kernel(before)


def key_tiles(rows):
    """kv_layout.h's key layout of a [1, S, Hkv, 64] int8 cache, as numpy computes it: per 64
    positions and head, [4 groups of 16 positions][16 dim quads][16 positions][4 dims]."""
    S, Hkv = rows.shape[1], rows.shape[2]
    return rows.reshape(S // 64, 4, 16, Hkv, 16, 4).transpose(0, 3, 1, 4, 2, 5).reshape(rows.shape)


def value_tiles(rows):
    """... and its value layout: per 64 positions and head, [16 position quads][64 dims][4]."""
    S, Hkv = rows.shape[1], rows.shape[2]
    return rows.reshape(S // 64, 16, 4, Hkv, 64).transpose(0, 3, 1, 4, 2).reshape(rows.shape)


def tiled_prefix(rows, tiles, n):
    """A cache whose first n positions (whole 64-position blocks) are in a tiled layout and the
    rest still in rows: what the first attention over n keys leaves (llm_kernels.cpp converts the
    blocks those keys are in, not pages no call has written)."""
    out = rows.copy()
    out[:, :n] = tiles(rows[:, :n])
    return out


def test_tiled_cache_layout_lifecycle(lib):
    """A model's int8 caches under the AMX kernel or on the avx2 tier (whose decode kernel reads
    the tiles, attention_decode.cpp): converted in place to the tile layout by the first attention
    over them (the blocks of the keys it reads), written there by update_cache, attended over
    there (decode and prefill), and, under AMX, back in rows once the generic kernel is chosen;
    every output against the float64 reference (ETSERVE_ISA=avx2 runs the avx2 case on a bigger
    host)."""
    lib.ets_attention_kernel.argtypes = [c_int]
    lib.ets_attention_kernel.restype = c_int
    lib.etserve_test_kv_layouts.argtypes = [c_int]
    before = lib.ets_attention_kernel(-1)
    amx = lib.ets_attention_kernel(1) == 1
    if not amx and (vector_isa(lib) != "avx2" or os.environ.get("ETSERVE_ATTENTION") == "generic"):
        pytest.skip("neither AMX-BF16 nor the avx2 tier here: the caches stay in rows")
    rng = np.random.default_rng(21)
    B, H, Hkv, D, Smax = 1, 14, 2, 64, 1024
    q1 = _quantized(rng, B, 1, H, D)
    q40 = _quantized(rng, B, 40, H, D)
    k = _quantized(rng, B, Smax, Hkv, D)
    v = _quantized(rng, B, Smax, Hkv, D)
    k_rows, v_rows = k[0].copy(), v[0].copy()

    def deq(rows, x):
        return (rows.astype(np.float64) - x[2]) * x[1]

    lib.etserve_test_kv_layouts(1)
    try:
        decode_tol = int8_tolerance("amx-tiled", 1, H // Hkv, D, vector_isa(lib))

        def expect(out, q, k, v, start):
            if amx:
                assert np.abs(out - ref_sdpa(q[3], k[3], v[3], start, True)).max() <= decode_tol
            else:  # the avx2 decode kernel's 7-bit weights, the generic tile's float ones
                expect_int8(lib, "generic", out, q, k, v, start, True)

        rc, out = run_quantized_sdpa(lib, q1, k, v, 700, True)
        assert rc == 0
        expect(out, q1, (k_rows.copy(), k[1], k[2], k[3]), (v_rows.copy(), v[1], v[2], v[3]), 700)
        # 701 keys read: their 11 blocks converted, positions 704.. untouched
        assert np.array_equal(k[0], tiled_prefix(k_rows, key_tiles, 704))
        assert np.array_equal(v[0], tiled_prefix(v_rows, value_tiles, 704))
        # update_cache writes new rows 701..703 in place in the layout
        new_k = rng.integers(-128, 128, (1, 3, Hkv, D)).astype(np.int8)
        new_v = rng.integers(-128, 128, (1, 3, Hkv, D)).astype(np.int8)
        for new, cache, rows in ((new_k, k[0], k_rows), (new_v, v[0], v_rows)):
            assert lib.etserve_test_update_cache_typed(1, new.ctypes.data, 1, 3, Hkv, D, cache.ctypes.data,
                                                       Smax, 701) == 0
            rows[:, 701:704] = new
        assert np.array_equal(k[0], tiled_prefix(k_rows, key_tiles, 704))
        assert np.array_equal(v[0], tiled_prefix(v_rows, value_tiles, 704))
        kd, vd = deq(k_rows, k), deq(v_rows, v)
        # decode (one A block) and prefill (40 rows: A blocks of 8 query vectors) over the tiles,
        # with threads
        lib.ets_set_num_threads.argtypes = [c_int]
        lib.ets_get_num_threads.restype = c_int
        threads = lib.ets_get_num_threads()
        for n in (1, 2):
            assert lib.ets_set_num_threads(n) == 0
            kr, vr = (k_rows, k[1], k[2], kd), (v_rows, v[1], v[2], vd)
            rc, out = run_quantized_sdpa(lib, q1, k, v, 703, True)
            assert rc == 0
            expect(out, q1, kr, vr, 703)
            rc, out = run_quantized_sdpa(lib, q40, k, v, 660, True)
            assert rc == 0
            expect(out, q40, kr, vr, 660)
        lib.ets_set_num_threads(threads)
        if not amx:
            return
        # the generic kernel: the caches go back to rows first
        assert lib.ets_attention_kernel(0) == 0
        rc, out = run_quantized_sdpa(lib, q1, k, v, 703, True)
        assert rc == 0
        expect_int8(lib, "generic", out, q1, (k_rows, k[1], k[2], kd), (v_rows, v[1], v[2], vd), 703, True)
        assert np.array_equal(k[0], k_rows) and np.array_equal(v[0], v_rows)
    finally:
        lib.etserve_test_kv_layouts(0)
        lib.ets_attention_kernel(before)


def run_quantized_sdpa(lib, q, k, v, start_pos, causal, mask=None, scale=None):
    (q8, qs, qz, _), (k8, ks, kz, _), (v8, vs, vz, _) = q, k, v
    B, S, H, D = q8.shape
    Smax, Hkv = k8.shape[1], k8.shape[2]
    out = np.full(q8.shape, np.nan, np.float32)
    rc = lib.etserve_test_custom_quantized_sdpa(
        i8ptr(q8), ptr(qs), i8ptr(qz), B, S, H, D, i8ptr(k8), ptr(ks), i8ptr(kz),
        i8ptr(v8), ptr(vs), i8ptr(vz), Smax, Hkv, start_pos, int(causal), ptr(mask),
        -1.0 if scale is None else scale, ptr(out))
    return rc, out


@pytest.mark.parametrize("causal", [True, False])
# decode over 3,000 keys: its last block's 56 keys in whole quads (the 8-bit decode kernel takes
# four keys per dword); over 2,051: three keys past the last quad
@pytest.mark.parametrize("shape", SHAPES + [(1, 40, 14, 2, 64, 700, 300), (1, 1, 14, 2, 64, 3000, 2999),
                                   (1, 1, 14, 2, 64, 3000, 2050)],
                         ids=lambda s: "B%d_S%d_H%d_Hkv%d_D%d_Smax%d_pos%d" % s)
def test_custom_quantized_sdpa_matches_dequantized_reference(lib, int8_kernel, shape, causal):
    B, S, H, Hkv, D, Smax, start_pos = shape
    rng = np.random.default_rng(hash(shape) % 2**32)
    q = _quantized(rng, B, S, H, D)
    k = _quantized(rng, B, Smax, Hkv, D)
    v = _quantized(rng, B, Smax, Hkv, D)
    rc, out = run_quantized_sdpa(lib, q, k, v, start_pos, causal)
    assert rc == 0
    expect_int8(lib, int8_kernel, out, q, k, v, start_pos, causal)


def test_custom_quantized_sdpa_decode_every_key_counts(lib, int8_kernel):
    """Flat attention (queries of zero: every visible key weighs the same), so that every key's
    value moves the output: cache lengths 1-9 and around the 64-key blocks, each block's last
    keys past its last whole group (the 8-bit decode kernel takes keys four at a time)."""
    rng = np.random.default_rng(5)
    H, Hkv, D, Smax = 14, 2, 64, 200
    q = _quantized(rng, 1, 1, H, D)
    q = (q[2].repeat(D, axis=-1).copy(), q[1], q[2], np.zeros(q[3].shape))  # q8 = its zero point
    k = _quantized(rng, 1, Smax, Hkv, D)
    v = _quantized(rng, 1, Smax, Hkv, D)
    for n in list(range(1, 10)) + [61, 62, 63, 64, 65, 66, 67, 127, 129, 130, 131]:
        rc, out = run_quantized_sdpa(lib, q, k, v, n - 1, True)
        assert rc == 0
        expect_int8(lib, int8_kernel, out, q, k, v, n - 1, True)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_custom_quantized_sdpa_threads_and_mask(lib, int8_kernel, threads):
    """Decode over a long cache split over threads, and the additive-mask form."""
    lib.ets_set_num_threads.argtypes = [c_int]
    lib.ets_get_num_threads.restype = c_int
    before = lib.ets_get_num_threads()
    rng = np.random.default_rng(threads)
    B, S, H, Hkv, D, Smax = 1, 1, 14, 2, 64, 2048
    q = _quantized(rng, B, S, H, D)
    k = _quantized(rng, B, Smax, Hkv, D)
    v = _quantized(rng, B, Smax, Hkv, D)
    mask = np.full((S, Smax), -np.inf, np.float32)
    mask[0, :300] = 0.0
    mask[0, 1500:1510] = 0.5
    try:
        assert lib.ets_set_num_threads(threads) == 0
        rc, out = run_quantized_sdpa(lib, q, k, v, 1800, True)
        rc2, out_m = run_quantized_sdpa(lib, q, k, v, 0, False, mask=mask)
    finally:
        lib.ets_set_num_threads(before)
    assert rc == 0 and rc2 == 0
    expect_int8(lib, int8_kernel, out, q, k, v, 1800, True)
    expect_int8(lib, int8_kernel, out_m, q, k, v, 0, False, mask=mask)


def _extreme_operands(rng, S, Smax, H=14, Hkv=2, D=64):
    """Queries scaled so that scores reach +-400 (one key dominates), values with zero points
    up to +-120 (the kernels must subtract them exactly), and a mask over S >= 2 rows: row 0
    sees keys 700.., row 1 only key 999 (and five keys pushed down by -1), any further row
    nothing."""
    q = _quantized(rng, 1, S, H, D)
    k = _quantized(rng, 1, Smax, Hkv, D)
    v = _quantized(rng, 1, Smax, Hkv, D)
    q[1][:] *= 20
    q = (q[0], q[1], q[2], (q[0].astype(np.float64) - q[2]) * q[1])
    v = (v[0], v[1], rng.integers(-120, 120, v[2].shape).astype(np.int8), None)
    v = (v[0], v[1], v[2], (v[0].astype(np.float64) - v[2]) * v[1])
    mask = np.full((S, Smax), -np.inf, np.float32)
    mask[0, 700:] = 0.0
    mask[1, 999] = 0.0
    mask[1, 40:45] = -1.0
    return q, k, v, mask


@pytest.mark.parametrize("threads", [1, 2])
def test_custom_quantized_sdpa_extremes(lib, int8_kernel, threads):
    """Scores in the hundreds (one key dominates), value zero points up to +-120, a mask that
    hides the first blocks entirely (the running max starts at -inf), a row with nothing
    visible (zeros), and a cache length that is not a multiple of any block."""
    lib.ets_set_num_threads.argtypes = [c_int]
    lib.ets_get_num_threads.restype = c_int
    before = lib.ets_get_num_threads()
    S, H, D, Smax = 3, 14, 64, 1001
    q, k, v, mask = _extreme_operands(np.random.default_rng(11 + threads), S, Smax)
    try:
        assert lib.ets_set_num_threads(threads) == 0
        rc, out = run_quantized_sdpa(lib, q, k, v, 0, False, mask=mask)
        rc2, out_c = run_quantized_sdpa(lib, q, k, v, Smax - S, True)
    finally:
        lib.ets_set_num_threads(before)
    assert rc == 0 and rc2 == 0
    ref = ref_sdpa(q[3][:, :2], k[3], v[3], 0, False, mask=mask[:2])
    ref_c = ref_sdpa(q[3], k[3], v[3], Smax - S, True)
    assert np.array_equal(out[0, 2], np.zeros((H, D), np.float32))  # row 2 sees nothing
    # values reach +-12 here: fp32 sums over a thousand keys, bounded relative to that
    assert np.abs(out[:, :2] - ref).max() <= 1e-5 * np.abs(ref).max()
    assert np.abs(out_c - ref_c).max() <= 1e-5 * np.abs(ref_c).max()


@pytest.mark.parametrize("threads", [1, 2])
def test_custom_quantized_sdpa_extremes_decode(lib, int8_kernel, threads):
    """The same extremes one query row at a time (decode: over tiled caches, the AMX kernel's
    16-bit fixed-point P V; in rows, attention_decode.cpp's kernel, 8-bit with VNNI), on a cache of 1,024 positions (tiled when the fixture says so):
    a row whose mask hides the first 700 keys, a row that sees only key 999 and five keys
    pushed down by -1, and the causal form."""
    lib.ets_set_num_threads.argtypes = [c_int]
    lib.ets_get_num_threads.restype = c_int
    before = lib.ets_get_num_threads()
    S = 2
    q, k, v, mask = _extreme_operands(np.random.default_rng(11 + threads), S, 1024)
    try:
        assert lib.ets_set_num_threads(threads) == 0
        for r in range(S):
            q1 = tuple(x[:, r:r + 1].copy() for x in q)
            rc, out = run_quantized_sdpa(lib, q1, k, v, 0, False, mask=mask[r:r + 1].copy())
            rc2, out_c = run_quantized_sdpa(lib, q1, k, v, 999, True)
            assert rc == 0 and rc2 == 0
            expect_int8(lib, int8_kernel, out, q1, k, v, 0, False, mask=mask[r:r + 1], relative=1e-5)
            expect_int8(lib, int8_kernel, out_c, q1, k, v, 999, True, relative=1e-5)
    finally:
        lib.ets_set_num_threads(before)


def test_custom_quantized_sdpa_refuses_bad_parameters(lib):
    rng = np.random.default_rng(4)
    q = _quantized(rng, 1, 2, 4, 16)
    k = _quantized(rng, 1, 10, 2, 16)
    v = _quantized(rng, 1, 10, 2, 16)
    assert run_quantized_sdpa(lib, q, k, v, 0, True)[0] == 0
    assert run_quantized_sdpa(lib, q, k, v, 9, True)[0] != 0  # past the cache
    assert lib.etserve_test_custom_sdpa_dtype(1) != 0  # the fp32 op handed int8 tensors


def test_update_cache_int8_rows(lib):
    rng = np.random.default_rng(9)
    value = rng.integers(-128, 128, (1, 3, 2, 64)).astype(np.int8)
    cache = rng.integers(-128, 128, (1, 20, 2, 64)).astype(np.int8)
    expect = cache.copy()
    expect[:, 5:8] = value
    rc = lib.etserve_test_update_cache_typed(1, value.ctypes.data, 1, 3, 2, 64, cache.ctypes.data, 20, 5)
    assert rc == 0
    assert np.array_equal(cache, expect)
    scales = np.zeros((1, 20, 2, 1), np.float32)
    sv = rng.uniform(0, 1, (1, 3, 2, 1)).astype(np.float32)
    assert lib.etserve_test_update_cache_typed(6, sv.ctypes.data, 1, 3, 2, 1, scales.ctypes.data, 20, 17) == 0
    assert np.array_equal(scales[:, 17:20], sv) and not scales[:, :17].any()


def test_registered_op_names(lib):
    names = {lib.etserve_llm_op_name(i).decode() for i in range(lib.etserve_llm_op_count())}
    assert {"llama::update_cache.out", "llama::custom_sdpa.out",
            "llama::sdpa_with_kv_cache.out", "llama::custom_quantized_sdpa.out",
            "etserve::linear_q4.out"} <= names
    assert lib.etserve_llm_op_name(lib.etserve_llm_op_count()) is None
    assert lib.etserve_llm_ops_registered() == 1


# ---------------------------------------------------------------------------
# End to end: a tiny LLM-shaped module whose attention uses the custom ops,
# exported to .pte (in a subprocess: the torch-linked kernels of the wheel
# register into the same runtime library as ours, so they must not share a
# process), run through ets_model_open / ets_forward and compared to eager.

EXPORT_SCRIPT = textwrap.dedent(r'''
    import json, sys
    import numpy as np
    import torch
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401 (llama ops)
    from executorch.exir import to_edge_transform_and_lower, EdgeCompileConfig
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    out_dir = sys.argv[1]
    VOCAB, H, HKV, D, SMAX = 64, 6, 2, 8, 32
    DIM = H * D

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(VOCAB, DIM)
            self.wq = torch.nn.Linear(DIM, DIM, bias=False)
            self.wk = torch.nn.Linear(DIM, HKV * D, bias=False)
            self.wv = torch.nn.Linear(DIM, HKV * D, bias=False)
            self.out = torch.nn.Linear(DIM, VOCAB, bias=False)
            self.register_buffer("k_cache", torch.zeros(1, SMAX, HKV, D))
            self.register_buffer("v_cache", torch.zeros(1, SMAX, HKV, D))
            mask = torch.full((SMAX, SMAX), float("-inf")).triu(1)
            self.register_buffer("mask", mask, persistent=False)

        def forward(self, tokens, input_pos):
            S = tokens.shape[1]
            x = self.emb(tokens)
            q = self.wq(x).view(1, S, H, D)
            k = self.wk(x).view(1, S, HKV, D)
            v = self.wv(x).view(1, S, HKV, D)
            start_pos = input_pos[0].item()
            torch._check_is_size(start_pos)
            torch._check(start_pos < SMAX)
            torch._check(start_pos + S <= SMAX)
            torch.ops.llama.update_cache(k, self.k_cache, start_pos)
            torch.ops.llama.update_cache(v, self.v_cache, start_pos)
            # the exporter's two forms: causal by start_pos, and an additive mask
            y1 = torch.ops.llama.custom_sdpa(q, self.k_cache, self.v_cache, start_pos,
                                             None, 0, True)
            m = self.mask.narrow(0, start_pos, S)
            y2 = torch.ops.llama.custom_sdpa(q, self.k_cache, self.v_cache, 0, m, 0, False)
            y = (y1 + 0.5 * y2).view(1, S, DIM)
            return self.out(y[:, -1, :])

    torch.manual_seed(0)
    model = Tiny().eval()
    eager = Tiny().eval()
    eager.load_state_dict(model.state_dict())

    seq = torch.export.Dim("seq", min=1, max=SMAX - 1)
    ex_tokens = torch.zeros(1, 2, dtype=torch.long)
    ex_pos = torch.tensor([0], dtype=torch.long)
    with torch.no_grad():
        ep = torch.export.export(model, (ex_tokens, ex_pos),
                                 dynamic_shapes=({1: seq}, None), strict=False)
    edge = to_edge_transform_and_lower(
        ep, partitioner=[XnnpackPartitioner()],
        compile_config=EdgeCompileConfig(_check_ir_validity=False),
        constant_methods={"get_max_seq_len": SMAX, "get_vocab_size": VOCAB,
                          "use_kv_cache": True, "enable_dynamic_shape": True,
                          "get_eos_ids": [1]})
    prog = edge.to_executorch()
    with open(out_dir + "/tiny.pte", "wb") as f:
        f.write(prog.buffer)
    ops = sorted({str(op.name) + "." + str(op.overload) for plan in
                  prog.executorch_program.execution_plan for op in plan.operators})

    # Steps: prefill, decodes, another chunk, one more decode to the end.
    rng = np.random.default_rng(0)
    steps, pos = [], 0
    for n in (5, 1, 1, 1, 9, 1, 14):
        steps.append((pos, rng.integers(0, VOCAB, n).tolist()))
        pos += n
    logits = []
    with torch.no_grad():
        for start, toks in steps:
            logits.append(eager(torch.tensor([toks]), torch.tensor([start])).numpy()[0])
    np.save(out_dir + "/logits.npy", np.stack(logits))
    with open(out_dir + "/steps.json", "w") as f:
        json.dump({"steps": steps, "ops": ops}, f)
''')


@pytest.fixture(scope="module")
def tiny_pte(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("tiny_llama_ops")
    proc = subprocess.run([sys.executable, "-c", EXPORT_SCRIPT, str(out)],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail("export failed:\n" + proc.stderr[-4000:])
    meta = json.loads((out / "steps.json").read_text())
    return out / "tiny.pte", meta, np.load(out / "logits.npy")


def test_pte_with_custom_ops_runs_through_our_library(run_pte, tiny_pte):
    path, meta, ref_logits = tiny_pte
    assert "llama::update_cache.out" in meta["ops"]
    assert "llama::custom_sdpa.out" in meta["ops"]
    got = run_pte(path, meta["steps"], ref_logits.shape[1])
    for start, g, ref in zip([s for s, _ in meta["steps"]], got, ref_logits):
        assert np.abs(g - ref).max() <= 1e-4, (start, np.abs(g - ref).max())
