"""TEST-ONLY fault injection: make the native runtime fail on purpose.

Off unless the environment sets ETSERVE_FAULT_INJECT (only the tests do):

    ETSERVE_FAULT_INJECT=forward_fail_on_token:ID
    ETSERVE_FAULT_INJECT=slow_session_writes:SECONDS
    ETSERVE_FAULT_INJECT=slow_forward:SECONDS

forward_fail_on_token: every forward call whose tokens include ID first overwrites
the KV cache from position 0 with other tokens (a failed native call may leave the
cache in any state), then raises NativeError. A request fails when its prompt holds
ID, or when it samples ID (logit_bias can force that), and what the next request
returns shows whether the engine dropped its cached prefix.

slow_session_writes: each --session-dir file takes SECONDS longer to write (a slow
SD card), so a test can stop the server while a state is still being written.

slow_forward: each forward call waits SECONDS (in the thread that runs it) before the
runtime computes, so a test can act while a step is surely under way (free a model under
it, say).
"""

from __future__ import annotations

import logging
import os
from typing import Sequence

from .native import NativeError

ENV = "ETSERVE_FAULT_INJECT"
log = logging.getLogger("etserve")


class _Wrapped:
    """A NativeModel with some calls of its own; everything else is the model's."""

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name: str):
        return getattr(self._model, name)


class FaultInjectingModel(_Wrapped):
    """A NativeModel whose forward fails on one token id."""

    def __init__(self, model, fail_on_token: int):
        super().__init__(model)
        self._fail_on_token = fail_on_token

    def forward(self, tokens: Sequence[int], start_pos: int) -> None:
        if self._fail_on_token in tokens:
            junk, end = 0 if self._fail_on_token else 1, start_pos + len(tokens)
            step = max(1, self._model.info.max_prefill_len)
            for pos in range(0, end, step):
                self._model.forward([junk] * min(step, end - pos), pos)
            raise NativeError(f"injected fault: forward of token {self._fail_on_token}")
        self._model.forward(tokens, start_pos)


class SlowForwardModel(_Wrapped):
    """A NativeModel whose forward calls start SECONDS late, in the calling thread."""

    def __init__(self, model, seconds: float):
        super().__init__(model)
        self._seconds = seconds
        try:  # the thread pool's thread itself waits (gevent's sleep would hand it to a hub)
            from gevent import monkey

            self._sleep = monkey.get_original("time", "sleep")
        except ImportError:
            import time

            self._sleep = time.sleep

    def _wait(self) -> None:
        self._sleep(self._seconds)

    def forward(self, tokens: Sequence[int], start_pos: int) -> None:
        self._wait()
        self._model.forward(tokens, start_pos)

    def forward_rows(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> None:
        self._wait()
        self._model.forward_rows(tokens, positions, slots)


def _spec(environ) -> tuple[str, str]:
    spec = environ.get(ENV, "")
    if not spec:
        return "", ""
    kind, _, arg = spec.partition(":")
    if kind == "forward_fail_on_token" and arg.isdigit():
        return kind, arg
    if kind in ("slow_session_writes", "slow_forward"):
        try:
            if float(arg) >= 0:
                return kind, arg
        except ValueError:
            pass
    raise ValueError(f"{ENV} must be forward_fail_on_token:ID, slow_session_writes:SECONDS or "
                     f"slow_forward:SECONDS, got {spec!r}")


def from_env(model, environ=os.environ):
    """`model`, wrapped when ETSERVE_FAULT_INJECT asks for a forward fault."""
    kind, arg = _spec(environ)
    if kind == "slow_forward":
        log.warning("TEST-ONLY fault injection is on: forward calls start %s s late", arg)
        return SlowForwardModel(model, float(arg))
    if kind != "forward_fail_on_token":
        return model
    log.warning("TEST-ONLY fault injection is on: forward calls with token %s fail", arg)
    return FaultInjectingModel(model, int(arg))


def session_write_delay(environ=os.environ) -> float:
    """Seconds each session file's write is held back (0 unless a test asks)."""
    kind, arg = _spec(environ)
    if kind != "slow_session_writes":
        return 0.0
    log.warning("TEST-ONLY fault injection is on: session files take %s s longer to write", arg)
    return float(arg)
