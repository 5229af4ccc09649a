"""Saved KV states of recent conversations ("sessions"), least recently used first out.

A snapshot is the used region of the model's KV caches (positions 0..n-1, as
NativeModel.kv_snapshot returns it) together with the n tokens whose keys and
values it holds. The cache keeps the total snapshot size under a cap in
bytes, evicting the least recently used sessions to make room.

With a session directory (DiskSessions), snapshots also live in files: the
live state after each generation and the states evicted from memory, written
atomically in the background, bounded in bytes (least recently used out),
found again at start-up. A file records which model build made it (the .pte
and the native library, by size, mtime and content hash) and the cache's shape;
a file of another build, or a damaged one, is ignored with a log line. The
snapshot bytes are used opaquely: whatever layout the native side uses, a file
is only ever restored into the build that wrote it.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import threading
import time
import zlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

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
        self.on_evict: Callable[[str, Snapshot], None] | None = None  # e.g. to keep it on disk

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
        evicted: list[tuple[str, Snapshot]] = []
        too_big = snapshot.nbytes > self.max_bytes
        with self._lock:
            old = self._entries.pop(session_id, None)
            if old is not None:
                self._bytes -= old.nbytes
            if not too_big:
                while self._entries and self._bytes + snapshot.nbytes > self.max_bytes:
                    victim, snap = self._entries.popitem(last=False)
                    self._bytes -= snap.nbytes
                    evicted.append((victim, snap))
                self._entries[session_id] = snapshot
                self._bytes += snapshot.nbytes
                self.evictions += len(evicted)
        if self.on_evict is not None:
            for victim, snap in evicted + ([(session_id, snapshot)] if too_big else []):
                self.on_evict(victim, snap)
        return [victim for victim, _ in evicted]

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
    a, b = tuple(a[:n]), tuple(b[:n])
    if a == b:  # the usual case for a conversation's next turn: compared in C
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]; slices compared in C
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo


# --- on disk ----------------------------------------------------------------------------------

DISK_MAGIC = b"ETSKV\x01\r\n"  # 8 bytes; the version is the sixth
_U32 = struct.Struct("<I")
_MAX_HEADER = 1 << 16
_MAX_PENDING = 4  # states waiting for the writer; older ones give way


def model_identity(*paths: str | os.PathLike | None) -> str:
    """Who may read a saved state: the files that make the KV layout (the .pte, the native
    library), each by name, size, mtime and a hash of its first and last MiB."""
    h = hashlib.sha256()
    for path in paths:
        if path is None:
            continue
        st = os.stat(path)
        h.update(f"{os.path.basename(path)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        with open(path, "rb") as f:
            h.update(f.read(1 << 20))
            if st.st_size > 2 << 20:
                f.seek(-(1 << 20), os.SEEK_END)
                h.update(f.read())
    return h.hexdigest()[:32]


def _token_bytes(tokens) -> bytes:
    a = array("i", tokens)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def _tokens_from(raw: bytes) -> tuple[int, ...]:
    a = array("i")
    a.frombytes(raw)
    if sys.byteorder != "little":
        a.byteswap()
    return tuple(a)


class CorruptFile(ValueError):
    """A session file that cannot be used; `ours`: its header names this model build, so it is
    one of ours damaged (deleted), not another build's file (left alone)."""

    def __init__(self, message: str, ours: bool = False):
        super().__init__(message)
        self.ours = ours


@dataclass
class DiskEntry:
    path: Path
    tokens: tuple[int, ...]
    size: int  # bytes of the whole file
    session_id: str | None
    used: float  # last use (the file's mtime): least recently used goes first


class DiskSessions:
    """KV snapshots in files under `directory`, at most `max_bytes` of them.

    File: DISK_MAGIC, a little-endian u32 header length, a JSON header (identity,
    cache shape, token count, data size, CRC32s, session id), the tokens (int32 LE),
    then the snapshot bytes. Written to a temporary name, fsynced, renamed into
    place: a reader never sees half a file. `attach` (once the cache's shape is
    known) reads the directory; `submit` queues a state for the background writer.
    Safe to call from several threads.
    """

    def __init__(self, directory: Path, max_bytes: int, identity: str, log=None):
        self.directory = Path(directory)
        self.max_bytes = max(0, int(max_bytes))
        self.identity = identity
        self._log = log
        self._lock = threading.Lock()
        self._entries: dict[str, DiskEntry] = {}  # by file name
        self._pending: list[tuple[tuple[int, ...], bytes | bytearray, str | None]] = []
        self._writing = False
        self._forgotten: set[str] = set()  # sessions deleted while a state of theirs may be in the writer
        self._idle = threading.Event()
        self._idle.set()
        self.shape: tuple[int, int] | None = None  # (caches, bytes per position) of this build
        self.ignored = 0  # files found but not used (another build's, damaged)
        self.write_delay = 0.0  # TEST-ONLY (faults.session_write_delay): a slow disk
        self.writes = 0
        self.loads = 0

    # the directory
    def attach(self, n_caches: int, bytes_per_position: int) -> None:
        """Read the directory (made 0700 if new; its files are written 0600). OSError if the
        directory cannot be made or read; a file in it that is not a usable state of this build,
        whatever it holds, is set aside (ignored, with a warning)."""
        self.shape = (n_caches, bytes_per_position)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.directory.is_dir():
            raise NotADirectoryError(f"{self.directory} is not a directory")
        stale_tmp = f".{self.identity[:12]}-"
        for path in sorted(self.directory.iterdir()):
            name = path.name
            if name.startswith(stale_tmp) and name.endswith(".tmp"):  # a write cut short by a crash
                _unlink(path)
                continue
            if not name.endswith(".kv") or not path.is_file():
                continue
            try:
                header, tokens = self._read_head(path)
                st = path.stat()
            except (OSError, CorruptFile, ValueError, RecursionError, MemoryError) as e:
                self.ignored += 1
                if isinstance(e, CorruptFile) and e.ours:  # this build's, damaged: of no use to anyone
                    self._warn("session file %s deleted: %s", path, e)
                    _unlink(path)
                else:
                    self._warn("session file %s ignored: %s", path, e)
                continue
            self._entries[name] = DiskEntry(path, tokens, st.st_size, header.get("session_id"), st.st_mtime)
        self._evict_to(self.max_bytes)
        if self._log is not None:
            self._log.info("session directory %s: %d saved states (%.1f MiB) of this model build, %d files ignored",
                           self.directory, len(self._entries), self.used_bytes / 2**20, self.ignored)

    def _read_head(self, path: Path) -> tuple[dict, tuple[int, ...]]:
        """Header and tokens, checked against this build; CorruptFile says what is wrong."""
        with open(path, "rb") as f:
            if f.read(len(DISK_MAGIC)) != DISK_MAGIC:
                raise CorruptFile("not an etserve session file (or another format version)")
            raw = f.read(_U32.size)
            if len(raw) != _U32.size or not 0 < _U32.unpack(raw)[0] <= _MAX_HEADER:
                raise CorruptFile("damaged header")
            raw = f.read(_U32.unpack(raw)[0])
            try:
                header = json.loads(raw)
                n, data_bytes = int(header["n_tokens"]), int(header["data_bytes"])
                shape = (int(header["n_caches"]), int(header["bytes_per_position"]))
            except (ValueError, KeyError, TypeError, RecursionError, AttributeError):
                raise CorruptFile("damaged header") from None
            if header.get("identity") != self.identity:
                raise CorruptFile("written by another model build")
            if shape != self.shape:
                raise CorruptFile(f"KV cache shape {shape}, this model's is {self.shape}", ours=True)
            if n <= 0 or data_bytes != n * shape[1]:
                raise CorruptFile("damaged header", ours=True)
            expected = len(DISK_MAGIC) + _U32.size + len(raw) + 4 * n + data_bytes
            if os.fstat(f.fileno()).st_size != expected:
                raise CorruptFile("truncated or extended", ours=True)
            token_raw = f.read(4 * n)
            if zlib.crc32(token_raw) != header.get("tokens_crc"):
                raise CorruptFile("damaged tokens", ours=True)
        session_id = header.get("session_id")
        if session_id is not None and not isinstance(session_id, str):
            raise CorruptFile("damaged header", ours=True)
        return header, _tokens_from(token_raw)

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(e.size for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[DiskEntry]:
        """Most recently used first."""
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: e.used, reverse=True)

    # finding and reading
    def knows(self, tokens: tuple[int, ...]) -> bool:
        """A state of exactly these tokens is on disk or on its way there."""
        with self._lock:
            return any(e.tokens == tokens for e in self._entries.values()) or \
                any(p[0] == tokens for p in self._pending)

    def best_prefix(self, prompt, limit: int) -> tuple[DiskEntry | None, int]:
        best, n = None, 0
        for entry in self.entries():
            k = common_prefix(prompt, entry.tokens, limit)
            if k > n:
                best, n = entry, k
        return best, n

    def for_session(self, session_id: str) -> DiskEntry | None:
        for entry in self.entries():
            if entry.session_id == session_id:
                return entry
        return None

    def read(self, entry: DiskEntry) -> bytearray:
        """The snapshot bytes of `entry`, checked (CorruptFile if not); plain file work, no
        locks, so it may run in a native thread (offload)."""
        header, tokens = self._read_head(entry.path)
        if tokens != entry.tokens:
            raise CorruptFile("changed since start-up")
        data = bytearray(int(header["data_bytes"]))
        with open(entry.path, "rb") as f:
            f.seek(-len(data), os.SEEK_END)
            if f.readinto(data) != len(data):
                raise CorruptFile("truncated")
        if zlib.crc32(data) != header.get("data_crc"):
            raise CorruptFile("damaged data")
        try:
            os.utime(entry.path)  # the file's mtime is its last use, across restarts
        except OSError:
            pass
        return data

    def load(self, entry: DiskEntry, offload: Callable = lambda fn, *a: fn(*a)) -> bytearray | None:
        """The snapshot bytes of `entry` (read through `offload`), or None (logged; the file
        dropped) if it is damaged or gone."""
        try:
            data = offload(self.read, entry)
        except FileNotFoundError:
            self._drop(entry, unlink=False)
            return None
        except (OSError, CorruptFile, ValueError) as e:
            self._warn("session file %s ignored: %s", entry.path, e)
            self.ignored += 1
            self._drop(entry, unlink=True)
            return None
        entry.used = time.time()
        self.loads += 1
        return data

    # writing
    def submit(self, tokens: tuple[int, ...], data: bytes | bytearray, session_id: str | None,
               spawn: Callable[[Callable[[], None]], None], offload: Callable) -> None:
        """Queue a state for the background writer (a state it extends replaces a queued one)."""
        if self.shape is None or len(data) + 4096 + 4 * len(tokens) > self.max_bytes:
            return
        with self._lock:
            self._forgotten.discard(session_id)
            self._pending = [p for p in self._pending if p[0] != tokens[: len(p[0])]]
            self._pending.append((tokens, data, session_id))
            del self._pending[:-_MAX_PENDING]
            start = not self._writing
            self._writing = True
            self._idle.clear()
        if start:
            spawn(lambda: self._drain(offload))

    def _drain(self, offload: Callable) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._writing = False
                    self._idle.set()
                    return
                tokens, data, session_id = self._pending.pop(0)
            try:
                self.write(tokens, data, session_id, offload)
            except Exception as e:  # a full disk, a removed directory: the server goes on without it
                self._warn("could not save a session state in %s: %s", self.directory, e)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued state is written; False on timeout."""
        return self._idle.wait(timeout)

    @property
    def queued(self) -> int:
        """States queued or being written."""
        with self._lock:
            return len(self._pending) + (1 if self._writing else 0)

    def write(self, tokens: tuple[int, ...], data: bytes | bytearray, session_id: str | None,
              offload: Callable = lambda fn, *a: fn(*a)) -> DiskEntry | None:
        """Write a state now (atomically, the file work through `offload`): first the least
        recently used states go until it fits under the cap (so a disk sized to the cap does not
        fill up), then it is written and the states it makes obsolete go."""
        header = 512 + len(self.identity) + 6 * len(session_id or "")  # at least its JSON header's length
        self._evict_to(self.max_bytes - (len(DISK_MAGIC) + _U32.size + header + 4 * len(tokens) + len(data)))
        path, size = offload(self._write_file, tokens, data, session_id)
        name = path.name
        entry = DiskEntry(path, tokens, size, session_id, time.time())
        obsolete = []
        with self._lock:
            if session_id is not None and session_id in self._forgotten:  # deleted while it was written
                obsolete.append(entry)
                self._forgotten.discard(session_id)
                entry = None
            for other in list(self._entries.values()) if entry is not None else ():
                # a state this one extends, or an older state of the same session
                if other.path != path and (other.tokens == tokens[: len(other.tokens)] or
                                           (session_id is not None and other.session_id == session_id)):
                    del self._entries[other.path.name]
                    obsolete.append(other)
            if entry is not None:
                self._entries[name] = entry
        for other in obsolete:
            _unlink(other.path)
        self._evict_to(self.max_bytes, keep=name)
        self.writes += 1
        return entry

    def _write_file(self, tokens: tuple[int, ...], data: bytes | bytearray,
                    session_id: str | None) -> tuple[Path, int]:
        """The file work of `write`: no locks, so it may run in a native thread."""
        n_caches, per = self.shape
        token_raw = _token_bytes(tokens)
        header = json.dumps({
            "identity": self.identity, "n_caches": n_caches, "bytes_per_position": per,
            "n_tokens": len(tokens), "data_bytes": len(data), "tokens_crc": zlib.crc32(token_raw),
            "data_crc": zlib.crc32(data), "session_id": session_id, "written": time.time(),
        }).encode()
        name = f"{self.identity[:12]}-{hashlib.sha1(token_raw).hexdigest()[:24]}.kv"
        path = self.directory / name
        tmp = self.directory / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            if self.write_delay:
                time.sleep(self.write_delay)
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(DISK_MAGIC + _U32.pack(len(header)) + header + token_raw)
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            _unlink(tmp)
            raise
        return path, path.stat().st_size

    def forget_session(self, session_id: str) -> bool:
        with self._lock:
            gone = [e for e in self._entries.values() if e.session_id == session_id]
            for e in gone:
                del self._entries[e.path.name]
            self._pending = [p for p in self._pending if p[2] != session_id]
            if self._writing:
                self._forgotten.add(session_id)
        for e in gone:
            _unlink(e.path)
        return bool(gone)

    def _drop(self, entry: DiskEntry, unlink: bool) -> None:
        with self._lock:
            if self._entries.get(entry.path.name) is entry:
                del self._entries[entry.path.name]
        if unlink:
            _unlink(entry.path)

    def _evict_to(self, max_bytes: int, keep: str | None = None) -> None:
        with self._lock:
            order = sorted(self._entries.values(), key=lambda e: e.used)
            total = sum(e.size for e in order)
            victims = []
            for e in order:
                if total <= max_bytes:
                    break
                if e.path.name == keep and total - e.size > 0:
                    continue
                victims.append(e)
                total -= e.size
                del self._entries[e.path.name]
        for e in victims:
            _unlink(e.path)

    def _warn(self, *args) -> None:
        if self._log is not None:
            self._log.warning(*args)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


class KvSessions:
    """Which session each slot's KV state belongs to, and moving states in and out of slots.

    A slot (slots.Slot) has `tokens` (what its caches hold) and `owner` (the session). Used by
    the Engine while it holds the step gate with that slot selected in the runtime: `switch`
    runs before a request's prefill, `persist_live` after its generation; `forget` from any
    thread (DELETE). Native calls go through `offload`. With `disk`, states are also kept in
    files (DiskSessions).
    """

    def __init__(self, model, max_bytes: int, offload, log=None, disk: DiskSessions | None = None):
        self.model = model
        self.cache = SessionCache(max_bytes)
        self._offload = offload
        self._log = log
        self.disk = disk
        on = max_bytes > 0 or disk is not None
        self._usable: bool | None = None if on else False  # None: not known yet
        self.off_reason = "" if on else "session_cache_mib is 0"
        self.saves = 0
        self.restores = 0
        self.restored_positions = 0
        self.disk_restores = 0
        if disk is not None:
            self._attach_disk(disk)

    def _attach_disk(self, disk: DiskSessions) -> None:
        """Learn the cache's shape (one forward call if none has run yet), then read the directory."""
        from .native import NativeError, Status

        try:
            try:
                info = self.model.kv_info()
            except NativeError as e:
                if e.code != Status.STATE:
                    raise
                self.model.forward([self.model.info.bos_id or 0], 0)  # the caches are found on a first call
                info = self.model.kv_info()
        except NativeError as e:
            self.disk = None
            if self._log is not None:
                self._log.warning("the session directory is not used: this model's KV caches cannot be saved: %s", e)
            self.usable()
            return
        self._usable = True
        try:
            disk.attach(info.n_caches, info.bytes_per_position)
        except OSError as e:  # not a directory, not ours to read: serve without it
            self.disk = None
            if self._log is not None:
                self._log.warning("the session directory %s is not used: %s", disk.directory, e)
            return
        self.cache.on_evict = self._evicted

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

    @staticmethod
    def lost(slot) -> None:
        """The slot's caches hold nothing reliable (a native call failed)."""
        slot.owner = None
        slot.tokens = []

    def forget(self, session_id: str, slots=()) -> bool:
        """Drops a session's saved state (in memory and on disk) and its claim on any slot;
        False if unknown."""
        known = self.cache.pop(session_id) is not None
        if self.disk is not None and self.disk.forget_session(session_id):
            known = True
        for slot in slots:
            if slot.owner == session_id:
                slot.owner = None
                known = True
        return known

    def _evicted(self, session_id: str, snap: Snapshot) -> None:
        """A state pushed out of memory goes to disk (unless it is there already)."""
        disk = self.disk
        if disk is not None and snap.tokens and not disk.knows(snap.tokens):
            from .offload import spawn

            disk.submit(snap.tokens, snap.data, session_id, spawn, self._offload)

    def persist_live(self, slot) -> None:
        """After a generation: the slot's state (selected in the runtime) to disk, in the
        background, unless it is there."""
        live = slot.tokens
        disk = self.disk
        if disk is None or not live or not self.usable():
            return
        tokens = tuple(live)
        if disk.knows(tokens):
            return
        from .native import NativeError
        from .offload import spawn

        try:
            data = self._offload(self.model.kv_snapshot, len(live), None)
        except NativeError as e:  # not saved; the generation that just ended is not affected
            if self._log is not None:
                self._log.warning("could not snapshot the KV cache for the session directory: %s", e)
            return
        disk.submit(tokens, data, slot.owner, spawn, self._offload)

    def switch(self, slot, prompt: list[int], session_id: str | None, reuse: bool) -> list[int]:
        """Make the slot (selected in the runtime) ready for a request of `session_id`
        (None: anonymous); the slot then belongs to that session.

        Saves the slot's state under its owner if this request is about to change it,
        restores the saved state that shares the most tokens with the prompt when that
        beats what the slot shares with it, and returns the tokens the slot then
        holds. The caller's prefix matching continues from there.

        Candidates: for a session, its own state (in memory, else on disk); for an
        anonymous request, or a session with no state anywhere, every saved state in
        memory and on disk.
        """
        live = slot.tokens
        if not self.enabled or (session_id is not None and session_id == slot.owner):
            return live
        owner = slot.owner
        limit = len(prompt) - 1  # the last prompt token is always run
        source: Snapshot | None = None
        entry: DiskEntry | None = None  # a state on disk to restore instead
        n = common_prefix(prompt, live, limit) if reuse else 0
        if reuse:
            snap, k = None, 0
            own, best = None, None
            if session_id is not None:
                snap = self.cache.get(session_id)
                if snap is not None:
                    k = common_prefix(prompt, snap.tokens, limit)
                elif self.disk is not None:
                    own = self.disk.for_session(session_id)
                    if own is not None and (j := common_prefix(prompt, own.tokens, limit)) > n:
                        entry, n = own, j
            if session_id is None or (snap is None and own is None):
                best, k = self.cache.best_prefix(prompt, limit)
                snap = self.cache.get(best, touch=False) if best is not None else None
                if self.disk is not None:
                    on_disk, j = self.disk.best_prefix(prompt, limit)
                    if j > max(k, n):
                        entry, n = on_disk, j
            if entry is None and snap is not None and k > n:
                source, n = snap, k
                if best is not None:
                    self.cache.get(best)  # used: the most recent now
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
                if slot.owner == owner:  # not deleted meanwhile
                    self.cache.put(owner, Snapshot(tuple(live), data))
                    self.saves += 1
        slot.owner = session_id
        if entry is not None and self.usable():
            data = self.disk.load(entry, self._offload)
            if data is not None:
                from .native import NativeError

                try:
                    self._offload(self.model.kv_restore, n, data)
                except NativeError as e:  # the file passed its checks, yet the runtime refuses it
                    if self._log is not None:
                        self._log.warning("session file %s ignored: %s", entry.path, e)
                    self.disk._drop(entry, unlink=True)
                    return []  # what the cache holds now is not known
                self.restores += 1
                self.disk_restores += 1
                self.restored_positions += n
                return list(entry.tokens[:n])
            return live
        if source is not None and self.usable():
            self._offload(self.model.kv_restore, n, source.data)
            self.restores += 1
            self.restored_positions += n
            return list(source.tokens[:n])
        return live

    def entries(self, slots=()) -> list[dict]:
        """Saved sessions, most recent first; those a slot holds marked live (with the slot),
        and listed even if their state was never saved."""
        # the sessions slots hold, most recently used first
        held = {s.owner: s for s in sorted(slots, key=lambda s: s.last_used, reverse=True) if s.owner is not None}
        saved = {e.id: e for e in self.cache.entries()}
        # a live session's tokens are its slot's (its saved copy may be turns behind); the saved
        # size is that copy's
        live = [{"id": owner, "tokens": len(slot.tokens), "bytes": saved[owner].bytes if owner in saved else 0,
                 "live": True, "slot": slot.index} for owner, slot in held.items()]
        return live + [{"id": e.id, "tokens": e.tokens, "bytes": e.bytes, "live": False, "slot": None}
                       for e in saved.values() if e.id not in held]
