"""DiskSessions on its own (no model): the file format, atomic writes, start-up scan, damaged
and foreign files, the byte cap. The engine's use of it, on the real model: test_disk_sessions.py."""

from __future__ import annotations

import logging
import os


from app.engine.offload import spawn
from app.engine.sessions import DiskSessions, model_identity

PER = 16  # bytes per position of a made-up cache
SHAPE = (2, PER)


def store(path, max_bytes=10 ** 6, identity="build-a", log=None) -> DiskSessions:
    disk = DiskSessions(path, max_bytes, identity, log or logging.getLogger("test"))
    disk.attach(*SHAPE)
    return disk


def state(tokens) -> tuple[tuple[int, ...], bytearray]:
    tokens = tuple(tokens)
    return tokens, bytearray(bytes((t * 7 + i) % 256 for t in tokens for i in range(PER)))


def test_a_written_state_is_found_again_by_a_new_store(tmp_path):
    disk = store(tmp_path)
    tokens, data = state(range(100, 140))
    disk.write(tokens, data, "conv-1")
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".kv")] == []  # no temporary left
    again = store(tmp_path)
    assert len(again) == 1 and again.ignored == 0
    entry, n = again.best_prefix(list(range(100, 130)) + [5, 6], 10 ** 6)
    assert n == 30 and entry.tokens == tokens and entry.session_id == "conv-1"
    assert again.for_session("conv-1") is entry and again.for_session("other") is None
    assert again.load(entry) == data


def test_submit_writes_in_the_background_and_a_longer_state_replaces_its_prefix(tmp_path):
    disk = store(tmp_path)
    t1, d1 = state(range(50))
    t2, d2 = state(range(80))  # the same conversation, one turn later
    disk.submit(t1, d1, None, spawn, lambda fn, *a: fn(*a))
    assert disk.flush(10)
    disk.submit(t2, d2, None, spawn, lambda fn, *a: fn(*a))
    assert disk.flush(10)
    assert [e.tokens for e in disk.entries()] == [t2] and len(list(tmp_path.glob("*.kv"))) == 1
    assert disk.knows(t2) and not disk.knows(t1)


def test_damaged_files_are_ignored_with_a_log_line_and_never_raise(tmp_path, caplog):
    disk = store(tmp_path)
    good = disk.write(*state(range(10, 30)), None)
    flipped = disk.write(*state(range(40, 70)), None)
    cut = disk.write(*state(range(80, 99)), None)
    (tmp_path / "junk.kv").write_bytes(b"not a session file at all" * 10)
    (tmp_path / "empty.kv").write_bytes(b"")
    raw = bytearray(flipped.path.read_bytes())
    raw[-5] ^= 0xFF  # in the data: found when it is read
    flipped.path.write_bytes(raw)
    cut.path.write_bytes(cut.path.read_bytes()[:-7])  # found at start-up
    with caplog.at_level(logging.WARNING, logger="test"):
        again = store(tmp_path)
    assert again.ignored == 3 and len(again) == 2
    assert sum("ignored" in r.getMessage() for r in caplog.records) == 3
    entry, n = again.best_prefix(list(range(40, 70)), 10 ** 6)
    assert n == 30
    with caplog.at_level(logging.WARNING, logger="test"):
        assert again.load(entry) is None
    assert "damaged data" in caplog.records[-1].getMessage()
    assert not flipped.path.exists() and len(again) == 1  # dropped, never offered again
    entry, _ = again.best_prefix(list(range(10, 30)), 10 ** 6)
    assert entry.path == good.path and again.load(entry) is not None


def test_another_builds_files_are_ignored(tmp_path, caplog):
    store(tmp_path, identity="build-a").write(*state(range(20)), "s")
    with caplog.at_level(logging.WARNING, logger="test"):
        other = store(tmp_path, identity="build-b")
    assert len(other) == 0 and other.ignored == 1
    assert "another model build" in caplog.text
    other_shape = DiskSessions(tmp_path, 10 ** 6, "build-a", logging.getLogger("test"))
    other_shape.attach(2, PER * 2)  # same build name, another cache layout
    assert len(other_shape) == 0 and other_shape.ignored == 1


def test_the_byte_cap_drops_the_least_recently_used(tmp_path):
    one = len(state(range(40))[1]) + 400  # a file: data, tokens and header
    disk = store(tmp_path, max_bytes=int(2.5 * one))
    a = disk.write(*state(range(0, 40)), None)
    os.utime(a.path, (1, 1))
    b = disk.write(*state(range(100, 140)), None)
    os.utime(b.path, (2, 2))
    disk = store(tmp_path, max_bytes=int(2.5 * one))  # the mtimes say who was used last
    disk.load(disk.best_prefix(list(range(0, 40)), 10 ** 6)[0])  # a is used: now the most recent
    disk.write(*state(range(200, 240)), None)
    names = {e.path.name for e in disk.entries()}
    assert a.path.name in names and b.path.name not in names and len(names) == 2
    assert disk.used_bytes <= 2.5 * one and not b.path.exists()
    assert len(list(tmp_path.glob("*.kv"))) == 2


def test_forgetting_a_session_removes_its_file(tmp_path):
    disk = store(tmp_path)
    disk.write(*state(range(20)), "gone")
    disk.write(*state(range(50, 60)), "kept")
    assert disk.forget_session("gone") and not disk.forget_session("gone")
    assert [e.session_id for e in disk.entries()] == ["kept"] and len(list(tmp_path.glob("*.kv"))) == 1


def test_the_identity_changes_with_the_file(tmp_path):
    f = tmp_path / "model.pte"
    f.write_bytes(b"x" * 5000)
    first = model_identity(f)
    assert model_identity(f) == first
    f.write_bytes(b"y" * 5000)
    assert model_identity(f) != first


def _hostile_header(header: bytes) -> bytes:
    from app.engine.sessions import DISK_MAGIC, _U32

    return DISK_MAGIC + _U32.pack(len(header)) + header


def test_a_poisoned_directory_never_stops_the_store_from_starting(tmp_path, caplog):
    """Whatever lies in the directory: a header nested too deep to parse, a header that is not an
    object, a directory and a FIFO named like states, a symlink loop, an unreadable file. Each
    is set aside with a warning; the good state is still found."""
    good = store(tmp_path).write(*state(range(10, 30)), None)
    (tmp_path / "deep.kv").write_bytes(_hostile_header(b"[" * 60000 + b"]" * 60000))
    (tmp_path / "list.kv").write_bytes(_hostile_header(b"[1, 2, 3]"))
    (tmp_path / "huge-count.kv").write_bytes(_hostile_header(
        b'{"identity": "build-a", "n_caches": 2, "bytes_per_position": 16, "n_tokens": 99999999999, '
        b'"data_bytes": 1599999999984}'))
    (tmp_path / "dir.kv").mkdir()
    os.mkfifo(tmp_path / "fifo.kv")
    (tmp_path / "loop.kv").symlink_to(tmp_path / "loop.kv")
    locked = tmp_path / "locked.kv"
    locked.write_bytes(_hostile_header(b"{}"))
    locked.chmod(0)
    with caplog.at_level(logging.WARNING):
        again = store(tmp_path)
    assert [e.tokens for e in again.entries()] == [good.tokens]
    assert again.ignored >= 4 and "deep.kv" in caplog.text and "list.kv" in caplog.text


def test_state_files_are_private(tmp_path):
    directory = tmp_path / "sessions"
    disk = store(directory)
    entry = disk.write(*state(range(5, 25)), "mine")
    assert directory.stat().st_mode & 0o777 == 0o700
    assert entry.path.stat().st_mode & 0o777 == 0o600


def test_old_states_go_before_a_new_one_is_written(tmp_path, monkeypatch):
    """At the cap, the least recently used state is deleted before the new file is written: a disk
    sized to the cap never holds both."""
    t1, d1 = state(range(100, 300))
    disk = store(tmp_path)
    disk.write(t1, d1, None)
    disk.max_bytes = int(disk.used_bytes * 1.5)  # room for one such state, not two
    seen = []
    write_file = disk._write_file

    def spy(*args):
        seen.append(sorted(p.name for p in tmp_path.glob("*.kv")))
        return write_file(*args)

    monkeypatch.setattr(disk, "_write_file", spy)
    t2, d2 = state(range(400, 600))
    disk.write(t2, d2, None)
    assert seen == [[]]  # the old state was gone before the new one was written
    assert [e.tokens for e in disk.entries()] == [t2]
