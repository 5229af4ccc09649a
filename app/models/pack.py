"""One archive of a built model, to build on one machine and serve on another.

    python -m app.models pack NAME [build options] [--dest DIR]   DIR/NAME-VARIANT.tar (+ .sha256)
    python -m app.models unpack ARCHIVE [--out MODEL_DIR]         checked, then MODEL_DIR

The archive is a plain tar (gzip takes fp32 weights to ~70%, 8da4w ones to ~87%; plain, it
unpacks at disk speed and with any tar) of one directory, NAME-VARIANT/: the build's etserve.json
first (a partial extraction is then refused by the server, not served), then its files in name
order, with fixed owners, modes and times, so one build always packs to the same bytes. Its
SHA-256 is written beside it in `sha256sum` format: `sha256sum -c` checks it on a box without
etserve. Stdlib only: unpacking runs on the serving box.
"""

from __future__ import annotations

import calendar
import hashlib
import io
import json
import os
import shutil
import tarfile
import time
from pathlib import Path
from typing import BinaryIO

from .manifest import (MANIFEST, ManifestError, check_model_dir, manifest_text, read_manifest, sha256_file,
                       with_checksums)
from .registry import cache_root


class _HashingWriter:
    """A write-only file that hashes what goes through it."""

    def __init__(self, f: BinaryIO):
        self.f, self.sha256 = f, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        return self.f.write(data)

    def tell(self) -> int:
        return self.f.tell()


def _top_name(manifest: dict, directory: Path) -> str:
    name, variant = manifest.get("name"), manifest.get("variant")
    return f"{name}-{variant}" if isinstance(name, str) and isinstance(variant, str) else directory.name


def _mtime(manifest: dict) -> int:
    try:
        return calendar.timegm(time.strptime(manifest.get("built_at", ""), "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return 0


def pack(directory: Path, dest: Path) -> tuple[Path, str]:
    """Archive the built model in `directory` into `dest`; (archive, its SHA-256)."""
    if read_manifest(directory) is None:
        raise ManifestError(directory / MANIFEST, "is missing or unreadable: only a directory built by "
                                                  "`python -m app.models build` can be packed")
    # Never pack a build that does not match its manifest; one from before checksums were recorded
    # gets them in the archive's copy (the build directory is only read).
    manifest = with_checksums(directory)
    assert manifest is not None
    manifest_bytes = manifest_text(manifest).encode()
    top, mtime = _top_name(manifest, directory), _mtime(manifest)
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / f"{top}.tar"
    tmp = dest / f".{archive.name}.tmp-{os.getpid()}"

    def info(name: str, size: int = 0, directory_entry: bool = False) -> tarfile.TarInfo:
        t = tarfile.TarInfo(f"{top}/{name}" if name else top)
        t.size, t.mtime, t.uid, t.gid, t.uname, t.gname = size, mtime, 0, 0, "", ""
        t.type, t.mode = (tarfile.DIRTYPE, 0o755) if directory_entry else (tarfile.REGTYPE, 0o644)
        return t

    try:
        with open(tmp, "wb") as raw:
            out = _HashingWriter(raw)
            with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT,  # type: ignore[call-overload]
                              copybufsize=1 << 22) as tar:
                tar.addfile(info("", directory_entry=True))
                tar.addfile(info(MANIFEST, len(manifest_bytes)), io.BytesIO(manifest_bytes))
                for name in sorted(manifest["files"]):
                    path = directory / name
                    with open(path, "rb") as f:
                        tar.addfile(info(name, os.fstat(f.fileno()).st_size), f)
        digest = out.sha256.hexdigest()
        os.replace(tmp, archive)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    archive.with_name(archive.name + ".sha256").write_text(f"{digest}  {archive.name}\n")
    return archive, digest


def _check_archive_checksum(archive: Path) -> None:
    sums = archive.with_name(archive.name + ".sha256")
    if not sums.is_file():
        return  # the manifest inside still checks every file
    expected = (sums.read_text().split() or [""])[0]
    if sha256_file(archive) != expected:
        raise ManifestError(archive, f"does not match its SHA-256 in {sums.name}: corrupted or incomplete copy")


def _members(tar: tarfile.TarFile, archive: Path) -> tuple[str, list[tarfile.TarInfo]]:
    """The archive's one top directory and its files; anything else (links, paths out of the
    top directory, devices) is refused."""
    members = tar.getmembers()
    if not members or not members[0].isdir() or "/" in members[0].name.strip("/"):
        raise ManifestError(archive, "is not a model archive (it must hold one directory)")
    top = members[0].name.strip("/")
    files = []
    for m in members[1:]:
        parent, _, name = m.name.partition("/")
        if parent != top or not m.isfile() or "/" in name or name in ("", ".", ".."):
            raise ManifestError(archive, f"is not a model archive: unexpected member {m.name!r}")
        files.append(m)
    return top, files


def unpack(archive: Path, out: Path | None = None) -> Path:
    """Extract a `pack` archive and check it against its manifest; the model directory. Default
    `out`: where `build` puts that build (so `etserve --model NAME` finds the default variant)."""
    _check_archive_checksum(archive)
    try:
        tar = tarfile.open(archive, mode="r:")
    except tarfile.TarError as e:
        raise ManifestError(archive, f"is not a tar archive ({e})") from None
    with tar:
        top, files = _members(tar, archive)
        if not files or files[0].name != f"{top}/{MANIFEST}":
            raise ManifestError(archive, f"is not a model archive: {MANIFEST} does not come first")
        manifest_file = tar.extractfile(files[0])
        assert manifest_file is not None
        try:
            manifest = json.loads(manifest_file.read())
            name, variant, listed = manifest["name"], manifest["variant"], set(manifest["files"])
        except (ValueError, KeyError, TypeError) as e:
            raise ManifestError(archive, f"has an unreadable {MANIFEST} ({e})") from None
        if not all(isinstance(v, str) and v not in ("", ".", "..") and Path(v).name == v for v in (name, variant)):
            raise ManifestError(archive, f"has a bad name or variant in its {MANIFEST}: {name!r}, {variant!r}")
        unlisted = sorted(m.name for m in files[1:] if m.name.partition("/")[2] not in listed)
        if unlisted:
            raise ManifestError(archive, f"holds files its {MANIFEST} does not list: {', '.join(unlisted)}")
        target = out or cache_root() / "models" / name / variant
        if target.exists():
            raise FileExistsError(f"{target} already exists: remove it first, or unpack with --out elsewhere")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.unpack-{os.getpid()}")
        tmp.mkdir()
        try:
            for m in files:
                source = tar.extractfile(m)
                assert source is not None
                with source, open(tmp / m.name.partition("/")[2], "wb") as f:
                    shutil.copyfileobj(source, f, 1 << 22)
            check_model_dir(tmp)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target
