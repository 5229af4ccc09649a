"""TEST-ONLY fault injection: make the native runtime fail on purpose.

Off unless the environment sets ETSERVE_FAULT_INJECT (only the tests do):

    ETSERVE_FAULT_INJECT=forward_fail_on_token:ID

Every forward call whose tokens include ID first overwrites the KV cache from
position 0 with other tokens (a failed native call may leave the cache in any
state), then raises NativeError. A request fails when its prompt holds ID, or
when it samples ID (logit_bias can force that), and what the next request
returns shows whether the engine dropped its cached prefix.
"""

from __future__ import annotations

import logging
import os
from typing import Sequence

from .native import NativeError

ENV = "ETSERVE_FAULT_INJECT"
log = logging.getLogger("etserve")


class FaultInjectingModel:
    """A NativeModel whose forward fails on one token id; everything else is the model's own."""

    def __init__(self, model, fail_on_token: int):
        self._model = model
        self._fail_on_token = fail_on_token

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def forward(self, tokens: Sequence[int], start_pos: int) -> None:
        if self._fail_on_token in tokens:
            junk, end = 0 if self._fail_on_token else 1, start_pos + len(tokens)
            step = max(1, self._model.info.max_prefill_len)
            for pos in range(0, end, step):
                self._model.forward([junk] * min(step, end - pos), pos)
            raise NativeError(f"injected fault: forward of token {self._fail_on_token}")
        self._model.forward(tokens, start_pos)


def from_env(model, environ=os.environ):
    """`model`, wrapped when ETSERVE_FAULT_INJECT asks for a fault."""
    spec = environ.get(ENV, "")
    if not spec:
        return model
    kind, _, arg = spec.partition(":")
    if kind != "forward_fail_on_token" or not arg.isdigit():
        raise ValueError(f"{ENV} must be forward_fail_on_token:ID, got {spec!r}")
    log.warning("TEST-ONLY fault injection is on: forward calls with token %s fail", arg)
    return FaultInjectingModel(model, int(arg))
