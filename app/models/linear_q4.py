"""etserve's 4-bit linear operator, ``etserve::linear_q4`` (native/src/linear_q4.h), for export.

torchao's 8da4w transform leaves each quantized ``nn.Linear`` with int4 weights in groups of 32 and
int8 per-token activations; XNNPACK's kernels for that layer (qd8-f32-qb4w) are bound by compute
on AVX2 hosts without VNNI. ``use_native_linears`` swaps those layers for ``LinearQ4`` modules
that call our operator with the same weights, packed for it (``pack``), so that the .pte runs them
in libetserve.so. The arithmetic is the same: per-token asymmetric int8 activations (torchao's
``choose_qparams_affine`` / ``quantize_affine``), symmetric int4 weights with a float scale per
group. Only the layers' kernel changes, not what the model computes.

``pack`` and ``reference`` are plain numpy (tests use them without torch); the operator's torch
registration (``register``) is for export: a reference implementation and a shape function.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator, Optional

import numpy as np

from .quantize_hook import wrapping_quantize

GROUP = 32
OP = "etserve::linear_q4"


ROWS = 4  # weight rows interleaved group by group (out_features must be a multiple)


def pack(q: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """int4 weights ``q`` [N, K] (values in [-8, 7]) and their scales [N, K/32] as the operator
    reads them: (weight uint8 [N, K/2], scales [N, K/32] as float16 bits in int16, row_sums
    float32 [N]); N a multiple of 4. (The scales travel as int16 so that no dtype cast of the
    module, such as the exporter's ``.to(float32)``, converts them.)

    The rows are stored four at a time, group by group, so that one pass over memory reads four
    rows: block b (rows 4b..4b+3), group g, row r is 16 bytes at ((b * G + g) * 4 + r) * 16,
    whose byte j holds w[32g+j] + 8 in its low nibble and w[32g+16+j] + 8 in its high one; its
    scale is element (b * G + g) * 4 + r, as float16 (the reference and the sums use the rounded
    scales). row_sums[n] = sum over g of scales[n, g] * sum(group g of row n)."""
    q = np.asarray(q)
    n, k = q.shape
    if k % GROUP:
        raise ValueError(f"in_features {k} is not a multiple of {GROUP}")
    if n % ROWS:
        raise ValueError(f"out_features {n} is not a multiple of {ROWS}")
    if q.min(initial=0) < -8 or q.max(initial=0) > 7:
        raise ValueError("int4 weights must lie in [-8, 7]")
    g = k // GROUP
    s16 = np.asarray(scales, dtype=np.float32).reshape(n, g).astype(np.float16)
    u = (q.astype(np.int16) + 8).astype(np.uint8).reshape(n, g, 2, 16)
    rows = u[:, :, 0, :] | (u[:, :, 1, :] << 4)  # [N, G, 16]
    weight = rows.reshape(n // ROWS, ROWS, g, 16).transpose(0, 2, 1, 3).reshape(n, k // 2)
    packed_scales = s16.reshape(n // ROWS, ROWS, g).transpose(0, 2, 1).reshape(n, g)
    sums = q.astype(np.int64).reshape(n, g, GROUP).sum(-1)
    row_sums = (s16.astype(np.float64) * sums).sum(-1).astype(np.float32)
    return np.ascontiguousarray(weight), np.ascontiguousarray(packed_scales).view(np.int16), row_sums


def unpack(weight: np.ndarray, scales: Optional[np.ndarray] = None):
    """``pack``'s weight back to int8 values [N, K] (with ``scales``: and the float32 scales
    [N, K/32] in row order)."""
    n, kb = weight.shape
    g = kb // 16
    rows = weight.reshape(n // ROWS, g, ROWS, 16).transpose(0, 2, 1, 3).reshape(n, g, 1, 16)
    lo = (rows & 0x0F).astype(np.int16) - 8
    hi = (rows >> 4).astype(np.int16) - 8
    w = np.concatenate([lo, hi], axis=2).reshape(n, kb * 2).astype(np.int8)
    if scales is None:
        return w
    s16 = np.ascontiguousarray(scales).view(np.float16)
    s = s16.reshape(n // ROWS, g, ROWS).transpose(0, 2, 1).reshape(n, g).astype(np.float32)
    return w, s


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """torchao's per-token asymmetric int8 quantization of x [M, K]: (q int32, scale [M, 1],
    zero point [M, 1])."""
    x = np.asarray(x, dtype=np.float32)
    lo = np.minimum(x.min(-1, keepdims=True), 0).astype(np.float32)
    hi = np.maximum(x.max(-1, keepdims=True), 0).astype(np.float32)
    scale = np.maximum((hi - lo) / np.float32(255), np.finfo(np.float32).eps).astype(np.float32)
    zp = np.clip(-128 - np.rint(lo / scale), -128, 127)
    q = np.clip(np.rint(x * (np.float32(1) / scale)) + zp, -128, 127).astype(np.int32)
    return q, scale, zp.astype(np.int32)


def reference(x: np.ndarray, weight: np.ndarray, scales: np.ndarray, bias: Optional[np.ndarray] = None) -> np.ndarray:
    """What the operator computes, in float64: x [..., K] -> [..., N]."""
    x = np.asarray(x, dtype=np.float32)
    shape = x.shape
    q, s, zp = quantize_rows(x.reshape(-1, shape[-1]))
    q_w, s_w = unpack(weight, scales)
    w = q_w.astype(np.float64) * np.repeat(s_w.astype(np.float64), GROUP, axis=1)
    y = ((q - zp).astype(np.float64) * s) @ w.T
    if bias is not None:
        y = y + bias
    return y.reshape(*shape[:-1], w.shape[0])


_registered = False


def register() -> None:
    """Define ``etserve::linear_q4`` and its ``.out`` variant for torch (export; idempotent)."""
    global _registered
    if _registered:
        return
    import torch

    lib = torch.library.Library("etserve", "DEF")
    schema = "Tensor input, Tensor weight, Tensor scales, Tensor row_sums, Tensor? bias"
    lib.define(f"linear_q4({schema}) -> Tensor")
    lib.define(f"linear_q4.out({schema}, *, Tensor(a!) out) -> Tensor(a!)")

    def compute(x, weight, scales, row_sums, bias):
        del row_sums  # the kernel's shortcut; the reference does not need it
        b = None if bias is None else bias.detach().cpu().numpy()
        y = reference(x.detach().cpu().numpy(), weight.cpu().numpy(), scales.cpu().numpy(), b)
        return torch.from_numpy(y.astype(np.float32))

    def out_variant(x, weight, scales, row_sums, bias, *, out):
        y = compute(x, weight, scales, row_sums, bias)
        out.resize_(y.shape).copy_(y)
        return out

    def shape_only(x, weight, scales, row_sums, bias):
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    def shape_only_out(x, weight, scales, row_sums, bias, *, out):
        return out

    lib.impl("linear_q4", compute, "CompositeExplicitAutograd")
    lib.impl("linear_q4.out", out_variant, "CompositeExplicitAutograd")
    lib.impl("linear_q4", shape_only, "Meta")
    lib.impl("linear_q4.out", shape_only_out, "Meta")
    register.lib = lib  # keep the registration alive
    _registered = True


def _module_class():
    import torch

    class LinearQ4(torch.nn.Module):
        """A quantized ``nn.Linear`` that calls ``etserve::linear_q4``."""

        def __init__(self, weight, scales, row_sums, bias, in_features: int):
            super().__init__()
            self.in_features = in_features
            self.out_features = int(weight.shape[0])
            self.register_buffer("weight", weight)
            self.register_buffer("scales", scales)
            self.register_buffer("row_sums", row_sums)
            self.register_buffer("bias", bias)

        def forward(self, x):
            return torch.ops.etserve.linear_q4(x, self.weight, self.scales, self.row_sums, self.bias)

        def extra_repr(self) -> str:
            return f"in_features={self.in_features}, out_features={self.out_features}, int4 g{GROUP}"

    return LinearQ4


def convertible(linear) -> bool:
    """Whether ``linear`` is an nn.Linear that torchao's 8da4w transform quantized to int4 in groups
    of 32 with per-token int8 activations and symmetric weights: what the operator computes."""
    import torch

    if not isinstance(linear, torch.nn.Linear):
        return False
    w = linear.weight
    needed = ("qdata", "scale", "zero_point", "block_size", "target_dtype", "activation_quantization")
    if not all(hasattr(w, a) for a in needed):
        return False
    return (w.target_dtype == torch.int4 and tuple(w.block_size) == (1, GROUP)
            and str(w.activation_quantization).endswith("int8_asym_per_token")
            and w.qdata.shape[1] % GROUP == 0 and w.qdata.shape[0] % ROWS == 0
            and not bool((w.zero_point != 0).any()))


def use_native_linears(model) -> int:
    """Replace every convertible linear of ``model`` (in place); returns how many."""
    import torch

    register()
    cls = _module_class()
    swaps = []
    for name, module in model.named_modules():
        for child_name, child in module.named_children():
            if convertible(child):
                swaps.append((module, child_name, child))
    for parent, child_name, lin in swaps:
        w = lin.weight
        q = w.qdata.detach().to(torch.int8).cpu().numpy()
        weight, scales, row_sums = pack(q, w.scale.detach().float().cpu().numpy())
        bias = None if lin.bias is None else lin.bias.detach().float().contiguous()
        setattr(parent, child_name, cls(torch.from_numpy(weight), torch.from_numpy(scales),
                                        torch.from_numpy(row_sums), bias, int(q.shape[1])))
    return len(swaps)


@contextlib.contextmanager
def swapping_linears(enabled: bool) -> Iterator[None]:
    """While active (``enabled``), the exporter's 8da4w weight transform ends with
    ``use_native_linears`` on the model it quantized."""
    if not enabled:
        yield
        return

    def wrap(original):
        def quantize(model, qmode, *args, **kwargs):
            model = original(model, qmode, *args, **kwargs)
            if qmode == "8da4w":
                swapped = use_native_linears(model)
                if not swapped:
                    raise RuntimeError("--linear-kernel etserve: the 8da4w transform left no int4 linear to swap")
                print(f"etserve::linear_q4 runs {swapped} linears", file=sys.stderr)
            return model
        return quantize

    with wrapping_quantize(wrap):
        yield
