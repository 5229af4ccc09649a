"""Q4_0 blocks carried over into our 4-bit layout, without a new quantization (build time).

A GGUF's Q4_0 block is 32 weights of one row: a float16 scale ``d`` and 4-bit values ``q`` in
0..15, each weight ``d * (q - 8)``. That is exactly what the 4-bit linears (8da4w, and
``etserve::linear_q4``) and the 4-bit embedding table hold: groups of 32 along a row, int4 values
in [-8, 7], one float16 scale a group (linear_q4.pack). Requantizing such a tensor with HQQ would
search a new grid for weights that already lie on one, and lose some of the file's precision;
carrying the blocks over keeps the file's weights bit for bit, as llama.cpp runs them.

How a tensor is recognised: while the checkpoint is streamed (checkpoint.stream), every Q4_0 weight's
dequantized fp32 rows are hashed as they are written (``hasher`` / ``add``). When torchao asks for
the HQQ quantization of a weight (``active``: the same function ``quant_cache.HqqCache`` wraps) in
4-bit groups of 32, a float32 weight of a carried shape is hashed; if its bytes are those of a Q4_0
tensor, the tensor's own values and scales are returned, read from the GGUF's blocks. A weight that
a fold changed (the int8 caches' key smoothing scales ``wk``) no longer matches and is quantized
as before; so is every other type, range and group size. A fold that scales whole rows (the
int8 caches' key smoothing: wq's rows times its factors, wk's divided by them) keeps a row's
values on its grid: ``refold`` recognises it (each row the old one times one factor, to float32
rounding) and the tensor is carried over with each block's scale times its row's factor (rounded
to float16 where the kernel stores it, 2^-11 of the scale at most).

Q4_0's scale takes the sign of a block's largest weight, which the block then holds as -8: about
half the scales are negative, and a negative block cannot be flipped (+8 is out of range). Our
``linear_q4`` takes them as they are; XNNPACK's 4-bit GEMM (qb4w) refuses them when the program
loads. So after the exporter's quantization (``for_xnnpack``), a 4-bit linear left to XNNPACK whose
scales are not all positive (one that ``linear_q4`` does not run: ``--linear-kernel xnnpack``, a
width not a multiple of 4) is quantized again, by HQQ, from the same weights.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from typing import Any, Callable, Iterator, Optional

from .quantize_hook import wrapping_hqq, wrapping_quantize

GROUP = 32  # weights a Q4_0 block holds: our group size
BLOCK_BYTES = 2 + GROUP // 2  # float16 d, then 16 bytes of two 4-bit values


def _q4_0():
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType.Q4_0


def blocks(t, span: tuple[int, int]):
    """Rows span[0]..span[1] of the Q4_0 GGUF tensor ``t`` as our layout holds them: ``(q, d)``,
    int8 values in [-8, 7] [rows, K] and float32 scales [rows, K / 32] (d, exactly)."""
    import numpy as np

    a, b = span
    raw = np.asarray(t.data[a:b], dtype=np.uint8)
    rows = b - a
    groups = raw.shape[-1] // BLOCK_BYTES
    raw = raw.reshape(rows, groups, BLOCK_BYTES)
    d = np.ascontiguousarray(raw[..., :2]).view(np.float16).reshape(rows, groups).astype(np.float32)
    qs = raw[..., 2:]
    # byte j of a block: weight j in its low nibble, weight j + 16 in its high one
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int8) - np.int8(8)
    return q.reshape(rows, groups * GROUP), d


def content_digest(array) -> str:
    """BLAKE2 of a C-contiguous array's bytes (numpy or torch, CPU)."""
    h = hashlib.blake2b(digest_size=20)
    h.update(memoryview(array).cast("B"))
    return h.hexdigest()


class CarriedBlocks:
    """The Q4_0 weights of one build, by the digest of their dequantized fp32 bytes."""

    def __init__(self) -> None:
        # digest -> (GGUF tensor, rows, per-row factors or None)
        self._tensors: dict[str, tuple[Any, tuple[int, int], Any]] = {}
        self._by_name: dict[str, tuple[Any, tuple[int, int]]] = {}
        self._shapes: set[tuple[int, int]] = set()
        self.refolded = 0  # tensors a fold scaled by rows, carried with scaled blocks
        self.carried = 0  # weights returned from their blocks
        self.names: list[str] = []  # the checkpoint names recorded, in file order
        self.seconds = 0.0
        self.requantized = 0  # carried weights quantized again for XNNPACK (``for_xnnpack``)
        self._bypass = False

    def hasher(self, t) -> Optional[Any]:
        """A running digest for a GGUF tensor whose rows are about to be written, if it is Q4_0."""
        if t.tensor_type != _q4_0() or t.data.ndim != 2:
            return None
        return hashlib.blake2b(digest_size=20)

    def add(self, name: str, digest: str, t, shape: tuple[int, ...], span: tuple[int, int]) -> None:
        self._tensors[digest] = (t, span, None)
        self._by_name[name] = (t, span)
        self._shapes.add(tuple(int(s) for s in shape))
        self.names.append(name)

    def refold(self, name: str, old, new) -> bool:
        """A fold replaced the recorded tensor ``name`` (``old``, float32 [rows, K]) by ``new``: if
        each row of ``new`` is its row of ``old`` times one factor (to float32 rounding), ``new``
        is carried over too, its blocks' scales times the factors. Returns whether it is."""
        import torch

        found = self._by_name.get(name)
        if found is None or old.shape != new.shape or old.ndim != 2 or new.dtype != torch.float32:
            return False
        old, new = old.detach(), new.detach().contiguous()
        at = old.abs().argmax(-1, keepdim=True)  # each row's largest weight: its factor's best estimate
        base = old.gather(-1, at)
        f = torch.where(base != 0, new.gather(-1, at) / torch.where(base != 0, base, 1), 1.0)
        if not bool(torch.isfinite(f).all()):
            return False
        if not bool(((old * f - new).abs() <= 1e-6 * new.abs() + 1e-30).all()):
            return False
        digest = content_digest(new.view(-1).view(torch.uint8).numpy())
        self._tensors[digest] = (found[0], found[1], f.reshape(-1).numpy().astype("float32"))
        self.refolded += 1
        return True

    def __len__(self) -> int:  # the file's Q4_0 weights (by checkpoint name)
        return len(self._by_name)

    def lookup(self, hp_tensor, block_size, qmin: int, qmax: int):
        """``(qdata int32, scale)`` of ``hp_tensor`` from its Q4_0 blocks, or None."""
        import torch

        if self._bypass or not self._tensors or hp_tensor.dtype != torch.float32 or hp_tensor.ndim != 2:
            return None
        if tuple(int(b) for b in block_size) != (1, GROUP) or (int(qmin), int(qmax)) != (-8, 7):
            return None
        if tuple(hp_tensor.shape) not in self._shapes:
            return None
        t0 = time.monotonic()
        try:
            w = hp_tensor.detach().contiguous()
            found = self._tensors.get(content_digest(w.view(-1).view(torch.uint8).numpy()))
            if found is None:
                return None
            t, span, factors = found
            q, d = blocks(t, span)
            if factors is not None:
                d = d * factors[:, None]
            self.carried += 1
            return torch.from_numpy(q).to(torch.int32), torch.from_numpy(d)
        finally:
            self.seconds += time.monotonic() - t0

    def wrap(self, fn: Callable) -> Callable:
        def carried_or_hqq(hp_tensor, block_size, qmin, qmax, **kwargs):
            if not kwargs.get("stochastic"):
                found = self.lookup(hp_tensor, block_size, qmin, qmax)
                if found is not None:
                    return found
            return fn(hp_tensor, block_size, qmin, qmax, **kwargs)

        carried_or_hqq.__wrapped__ = fn
        return carried_or_hqq

    @contextlib.contextmanager
    def active(self) -> Iterator["CarriedBlocks"]:
        """Inside the block, torchao's HQQ returns a Q4_0 weight's own blocks (and otherwise runs
        whatever was there: the quantization cache's wrapper, or the library function)."""
        with wrapping_hqq(self.wrap):
            yield self

    def requantize_for_xnnpack(self, model) -> int:
        """Quantize again, by HQQ, every 4-bit linear of ``model`` still torchao's (XNNPACK runs
        it) whose scales are not all positive; returns how many."""
        import torch
        from torchao.quantization.quantize_.workflows.intx.intx_choose_qparams_algorithm import \
            IntxChooseQParamsAlgorithm
        from torchao.quantization.quantize_.workflows.intx.intx_unpacked_to_int8_tensor import \
            IntxUnpackedToInt8Tensor

        count = 0
        for module in model.modules():
            w = getattr(module, "weight", None)
            if not isinstance(module, torch.nn.Linear) or not isinstance(w, IntxUnpackedToInt8Tensor):
                continue
            if w.target_dtype != torch.int4 or bool((w.scale > 0).all()):
                continue
            self._bypass = True
            try:
                new = IntxUnpackedToInt8Tensor.from_hp(
                    w.dequantize(), list(w.block_size), torch.int4, activation_quantization=w.activation_quantization,
                    intx_choose_qparams_algorithm=IntxChooseQParamsAlgorithm.HQQ_SCALE_ONLY)
            finally:
                self._bypass = False
            module.weight = torch.nn.Parameter(new, requires_grad=False)
            count += 1
        self.requantized += count
        return count

    @contextlib.contextmanager
    def for_xnnpack(self) -> Iterator[None]:
        """While active, the exporter's quantization ends with ``requantize_for_xnnpack``: enter it
        after every other hook of the quantization (app/models/quantize_hook.py), so that it sees
        the linears ``linear_q4`` took over and leaves them alone."""
        if not self._tensors:
            yield
            return
        def wrap(original):
            def quantize(model, qmode, *args, **kwargs):
                model = original(model, qmode, *args, **kwargs)
                self.requantize_for_xnnpack(model)
                return model
            return quantize

        with wrapping_quantize(wrap):
            yield

    def summary(self) -> str:
        again = f", {self.requantized} quantized again for XNNPACK (negative scales)" if self.requantized else ""
        again += f", {self.refolded} of them scaled by rows by a fold" if self.refolded else ""
        return (f"Q4_0: {self.carried} of the file's {len(self)} Q4_0 weights carried over as they are{again} "
                f"({self.seconds:.1f}s)")
