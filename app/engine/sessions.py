"""Saved KV states of recent conversations ("sessions"), least recently used first out.

A snapshot is the used region of the model's KV caches (positions 0..n-1, as
NativeModel.kv_snapshot returns it) together with the n tokens whose keys and
values it holds. The cache keeps the total snapshot size under a cap in
bytes, evicting the least recently used sessions to make room.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

MAX_SESSION_ID_CHARS = 128


@dataclass(frozen=True)
class Snapshot:
    tokens: tuple[int, ...]  # whose keys/values fill positions 0..len-1
    data: bytes | bytearray  # len(tokens) * bytes_per_position bytes

    @property
    def nbytes(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class SessionEntry:
    id: str
    tokens: int
    bytes: int


class SessionCache:
    """An LRU of Snapshots keyed by session id, at most `max_bytes` of snapshot data.

    Safe to call from several threads (each method holds a lock briefly).
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max(0, int(max_bytes))
        self._entries: OrderedDict[str, Snapshot] = OrderedDict()  # oldest first
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0

    @property
    def used_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._entries

    def get(self, session_id: str, *, touch: bool = True) -> Snapshot | None:
        with self._lock:
            snap = self._entries.get(session_id)
            if snap is not None and touch:
                self._entries.move_to_end(session_id)
            return snap

    def put(self, session_id: str, snapshot: Snapshot) -> list[str]:
        """Store (or replace) a session's snapshot as the most recent; returns the ids evicted.

        A snapshot larger than the whole cap is not kept (and the session's older one goes).
        """
        evicted: list[str] = []
        with self._lock:
            old = self._entries.pop(session_id, None)
            if old is not None:
                self._bytes -= old.nbytes
            if snapshot.nbytes > self.max_bytes:
                return evicted
            while self._entries and self._bytes + snapshot.nbytes > self.max_bytes:
                victim, snap = self._entries.popitem(last=False)
                self._bytes -= snap.nbytes
                evicted.append(victim)
            self._entries[session_id] = snapshot
            self._bytes += snapshot.nbytes
            self.evictions += len(evicted)
        return evicted

    def pop(self, session_id: str) -> Snapshot | None:
        with self._lock:
            snap = self._entries.pop(session_id, None)
            if snap is not None:
                self._bytes -= snap.nbytes
            return snap

    def best_prefix(self, prompt: list[int], limit: int) -> tuple[str | None, int]:
        """The session whose tokens share the longest prefix with `prompt` (at most `limit`), and its length."""
        best_id, best = None, 0
        with self._lock:
            items = list(self._entries.items())
        for session_id, snap in items:
            n = common_prefix(prompt, snap.tokens, limit)
            if n > best:
                best_id, best = session_id, n
        return best_id, best

    def entries(self) -> list[SessionEntry]:
        """Most recently used first."""
        with self._lock:
            return [SessionEntry(k, len(v.tokens), v.nbytes) for k, v in reversed(self._entries.items())]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


def common_prefix(a, b, limit: int | None = None) -> int:
    """Length of the longest common prefix of two token sequences, at most `limit`."""
    n = min(len(a), len(b))
    if limit is not None:
        n = min(n, limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class KvSessions:
    """Which session the live KV cache belongs to, and moving states in and out of it.

    Used by the Engine under its lock: `switch` runs before a request's prefill,
    `forget` from any thread (DELETE). Native calls go through `offload`.
    """

    def __init__(self, model, max_bytes: int, offload, log=None):
        self.model = model
        self.cache = SessionCache(max_bytes)
        self.owner: str | None = None  # whose conversation the live cache holds
        self._offload = offload
        self._log = log
        self._usable: bool | None = None if max_bytes > 0 else False  # None: not known yet
        self.off_reason = "" if max_bytes > 0 else "session_cache_mib is 0"
        self.saves = 0
        self.restores = 0
        self.restored_positions = 0

    @property
    def enabled(self) -> bool:
        return self._usable is not False

    def usable(self) -> bool:
        """True once the native side knows the caches; False for good if it never can."""
        if self._usable is not None:
            return self._usable
        from .native import NativeError, Status

        try:
            self.model.kv_info()
        except NativeError as e:
            if e.code == Status.STATE:
                return False  # no forward call has run yet: ask again later
            self._usable = False
            self.off_reason = str(e)
            self.cache.clear()
            if self._log is not None:
                self._log.warning("sessions are off for this model (plain prefix reuse still works): %s", e)
            return False
        self._usable = True
        return True

    def lost(self) -> None:
        """The live cache holds nothing reliable (a native call failed)."""
        self.owner = None

    def forget(self, session_id: str) -> bool:
        """Drops a session's saved state and its claim on the live cache; False if unknown."""
        known = self.cache.pop(session_id) is not None
        if self.owner == session_id:
            self.owner = None
            known = True
        return known

    def switch(self, live: list[int], prompt: list[int], session_id: str | None, reuse: bool) -> list[int]:
        """Make the live cache ready for a request of `session_id` (None: anonymous).

        Saves the live state under its owner if this request is about to change it,
        restores the saved state that shares the most tokens with the prompt (the
        request's own session, or for an anonymous request any session) when that
        beats what the live cache shares with it, and returns the tokens the live
        cache then holds. The caller's prefix matching continues from there.
        """
        if not self.enabled or (session_id is not None and session_id == self.owner):
            return live
        owner = self.owner
        limit = len(prompt) - 1  # the last prompt token is always run
        source: Snapshot | None = None
        n = common_prefix(prompt, live, limit) if reuse else 0
        if reuse:
            if session_id is not None:
                snap = self.cache.get(session_id)
                k = common_prefix(prompt, snap.tokens, limit) if snap is not None else 0
            else:
                best, k = self.cache.best_prefix(prompt, limit)
                snap = self.cache.get(best) if best is not None else None
            if snap is not None and k > n:
                source, n = snap, k
        if owner is not None and live and self.usable():
            stored = self.cache.get(owner, touch=False)
            if stored is None or stored.tokens != tuple(live):
                # the owner's older state is replaced: its buffer takes the new one (unless it
                # is the state about to be restored)
                reuse_buffer = None
                if stored is not None and stored is not source and isinstance(stored.data, bytearray):
                    self.cache.pop(owner)
                    reuse_buffer = stored.data
                data = self._offload(self.model.kv_snapshot, len(live), reuse_buffer)
                if self.owner == owner:  # not deleted meanwhile
                    self.cache.put(owner, Snapshot(tuple(live), data))
                    self.saves += 1
        self.owner = session_id
        if source is not None and self.usable():
            self._offload(self.model.kv_restore, n, source.data)
            self.restores += 1
            self.restored_positions += n
            return list(source.tokens[:n])
        return live

    def entries(self, live_tokens: int) -> list[dict]:
        """Saved sessions, most recent first; the live owner (holding `live_tokens`) marked,
        and listed even if its state was never saved."""
        out = []
        for e in self.cache.entries():
            out.append({"id": e.id, "tokens": e.tokens, "bytes": e.bytes, "live": e.id == self.owner})
        if self.owner is not None and self.owner not in self.cache:
            out.insert(0, {"id": self.owner, "tokens": live_tokens, "bytes": 0, "live": True})
        return out
