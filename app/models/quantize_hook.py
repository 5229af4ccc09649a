"""One place that hooks the exporter's weight-quantization transform.

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
