"""Sequence slots: which KV state each request in flight uses, and who waits for one.

The runtime keeps `n` KV states on one weight load (native ets_kv_slots; slot 0 is the
program's own caches), switched by pointer before each step. A slot keeps what its last
request left in it (its `tokens`), so a finished request's slot is a prefix-cache entry: the
next request whose prompt starts the same way, or of the same session, is given that slot and
reads only the rest. A request takes a free slot when it starts and gives it back when it
ends; when all are busy it waits, and slots are handed out in arrival order.

Choosing among free slots (SlotTable.best): the session's own slot, else one whose contents
the prompt continues, else the one whose contents are worth least (what it held is then
overwritten; a session's state is saved aside first, see sessions.py).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .sessions import common_prefix


@dataclass
class Slot:
    index: int
    tokens: list[int] = field(default_factory=list)  # whose keys/values fill positions 0..len-1
    owner: str | None = None  # the session whose conversation it holds
    busy: bool = False
    last_used: float = 0.0
    # what /slots shows of the request using it
    request: int | None = None  # the request's sequence number
    task: str = ""  # "prefill", "decode" or ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    processed: int = 0  # prompt tokens in the cache so far
    generated: int = 0
    started: float = 0.0  # when its request began on its prompt (perf_counter)
    released: threading.Event = field(default_factory=threading.Event, repr=False)

    def state(self) -> dict:
        return {
            "id": self.index,
            "state": "busy" if self.busy else "idle",
            "is_processing": self.busy,  # llama.cpp's name for it, and its -1 for no task
            "id_task": self.request if self.busy and self.request is not None else -1,
            "task": self.task or None,
            "request": self.request,
            "session": self.owner,
            "n_ctx_used": len(self.tokens),
            "prompt_tokens": self.prompt_tokens if self.busy else None,
            "cached_tokens": self.cached_tokens if self.busy else None,
            "prompt_processed": self.processed if self.busy else None,
            "generated_tokens": self.generated if self.busy else None,
        }


class SlotTable:
    """The slots and the line of requests waiting for one. Thread-safe (gevent or threads)."""

    _POLL_S = 0.25  # how often a waiter checks whether its client left

    def __init__(self, n: int):
        self.slots = [Slot(i) for i in range(max(1, n))]
        self._mutex = threading.Lock()
        self._line: deque[list] = deque()  # [event, chosen slot or None], oldest first

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def busy(self) -> int:
        return sum(1 for s in self.slots if s.busy)

    @property
    def waiting(self) -> int:
        return len(self._line)

    def resize(self, n: int) -> None:
        """Before any request runs (the runtime's slots are made at start-up)."""
        with self._mutex:
            self.slots = [Slot(i) for i in range(max(1, n))]

    SIMILARITY = 0.5  # a slot is reused when the prompt shares at least this part of what it holds

    @classmethod
    def best(cls, free: list[Slot], prompt: list[int], session_id: str | None) -> Slot:
        """The free slot a request should take: the session's own; else the one whose contents
        the prompt mostly continues (at least SIMILARITY of them, like llama.cpp's
        --slot-prompt-similarity), the longest such prefix first; else the one whose contents
        are worth least: an empty one, or the least recently used (a short shared prefix, such
        as a system prompt, is copied in from wherever it is: Engine._prepare)."""
        if session_id is not None:
            own = [s for s in free if s.owner == session_id]
            if own:
                return own[0]
        limit = len(prompt) - 1  # the last prompt token is always run
        shared = {s.index: common_prefix(prompt, s.tokens, limit) for s in free}
        similar = [s for s in free if shared[s.index] > 0 and shared[s.index] >= cls.SIMILARITY * len(s.tokens)]
        if similar:
            return max(similar, key=lambda s: (shared[s.index], s.last_used))
        return min(free, key=lambda s: (bool(s.tokens), s.last_used))

    def acquire(self, prompt: list[int], session_id: str | None, gave_up: Callable[[], bool],
                timeout: float, prefer: Slot | None = None) -> Slot | bool | None:
        """A free slot, marked busy: at once if one is free and nobody waits, else in arrival
        order. False if `gave_up()` turned true while waiting, None after `timeout` seconds.
        `prefer`: a slot about to be freed (a superseded request's) that this one should wait
        for rather than take another (up to a second)."""
        deadline = time.monotonic() + timeout
        if prefer is not None and prefer.busy:
            prefer.released.wait(1.0)

        def choose(free: list[Slot]) -> Slot:
            if prefer is not None and prefer in free:
                return prefer
            return self.best(free, prompt, session_id)

        with self._mutex:
            free = [s for s in self.slots if not s.busy]
            if free and not self._line:
                return self._take(choose(free))
            entry = [threading.Event(), None, choose]
            self._line.append(entry)
        while not entry[0].wait(self._POLL_S):
            left = gave_up()
            if left or time.monotonic() > deadline:
                with self._mutex:
                    if entry[1] is None:
                        self._line.remove(entry)
                        return False if left else None
                break
        return entry[1]

    def _take(self, slot: Slot) -> Slot:
        slot.busy = True
        slot.released.clear()
        slot.last_used = time.monotonic()
        return slot

    def release(self, slot: Slot) -> None:
        """The request using `slot` ended: the slot goes to the oldest waiter, if any."""
        with self._mutex:
            slot.busy = False
            slot.task = ""
            slot.request = None
            slot.last_used = time.monotonic()
            slot.released.set()
            if self._line:
                entry = self._line.popleft()
                free = [s for s in self.slots if not s.busy]
                entry[1] = self._take(entry[2](free))
                entry[0].set()

    def states(self) -> list[dict]:
        return [s.state() for s in self.slots]
