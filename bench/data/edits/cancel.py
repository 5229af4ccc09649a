"""Per-request cancellation: a flag plus an optional probe of the client's socket."""

from __future__ import annotations

import _socket
import os
from typing import Callable


class CancelToken:
    """Checked by the engine between prefill chunks and between decode steps."""

    def __init__(self, probe: Callable[[], bool] | None = None, supersede_key: str | None = None):
        self._cancelled = False
        # a newer request with the same key cancels this one (Engine.generate): an editor's next
        # completion request makes the one in flight worthless
        self.supersede_key = supersede_key
        self._probe = probe
        self.reason: str | None = None
        self.generations: list = []  # GenerationStats of each generation run under it (the request log)
        self.listeners: list[Callable[[], None]] = []  # called once, when it is cancelled

    def close(self) -> None:
        """Release what the probe holds (a duplicated socket descriptor)."""
        close = getattr(self._probe, "close", None)
        if close is not None:
            close()

    def cancel(self, reason: str = "cancelled") -> None:
        if not self._cancelled:
            self._cancelled = True
            self.reason = reason
            for listener in self.listeners:
                listener()

    @property
    def cancelled(self) -> bool:
        if not self._cancelled and self._probe is not None and self._probe():
            self.cancel("client disconnected")
        return self._cancelled


class SocketClosedProbe:
    """True once the peer has closed the socket (EOF or reset).

    Works on a private duplicate of the descriptor through the C-level
    `_socket` module, which gevent does not patch, so a peek never yields to
    the hub or blocks; it does not consume pipelined request bytes.
    """

    def __init__(self, fileno: int):
        self._sock = _socket.socket(fileno=os.dup(fileno))

    def __call__(self) -> bool:
        try:
            data = self._sock.recv(1, _socket.MSG_PEEK | _socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        return data == b""

    def close(self) -> None:
        self._sock.close()
