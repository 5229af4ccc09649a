"""One place that hooks the exporter's weight-quantization transform, and torchao's HQQ in it.

ExecuTorch's llama exporter quantizes weights through
``source_transformation.quantize.quantize``, which ``get_quant_weight_transform`` looks up when
the exporter asks for the transform. ``wrapping_quantize`` replaces it for the duration of a
``with`` block by a wrapper of the function it found, so that hooks compose (the 8-bit output
projection and the native linears each wrap what is there) and leave it as it was on the way out.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

Quantize = Callable[..., object]  # quantize(model, qmode, *args, **kwargs) -> model
# Where torchao's IntxUnpackedToInt8Tensor.from_hp looks its HQQ scale search up (imported by name).
HQQ_MODULE = "torchao.quantization.quantize_.workflows.intx.intx_unpacked_to_int8_tensor"
HQQ_FUNCTION = "_choose_qparams_and_quantize_scale_only_hqq"


@contextlib.contextmanager
def wrapping_quantize(wrap: Callable[[Quantize], Quantize]) -> Iterator[None]:
    """While active, the exporter's quantize is ``wrap(the quantize it had)``."""
    from executorch.examples.models.llama.source_transformation import quantize as qmod

    original = qmod.quantize
    qmod.quantize = wrap(original)
    try:
        yield
    finally:
        qmod.quantize = original


@contextlib.contextmanager
def wrapping_hqq(wrap: Callable[[Callable], Callable]) -> Iterator[None]:
    """While active, torchao's HQQ scale search (what the 8da4w linears and the 4-bit embedding
    are quantized by) is ``wrap(the function it had)``: the quantization cache's and the Q4_0
    carry-over's wrappers compose, the one entered last asked first."""
    import importlib

    module = importlib.import_module(HQQ_MODULE)
    original = getattr(module, HQQ_FUNCTION)
    setattr(module, HQQ_FUNCTION, wrap(original))
    try:
        yield
    finally:
        setattr(module, HQQ_FUNCTION, original)
