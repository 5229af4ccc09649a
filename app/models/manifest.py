"""etserve.json, the manifest of a built model directory: the one module that names, writes, reads
and checks it.

The build writes it last, with the size and SHA-256 of every file beside it; `pack` archives a
directory with it; the server refuses, before loading anything, a directory whose files do not
match it (app/model_host.py). A directory without one (a .pte from ExecuTorch's own export_llm
with its tokenizer) is served unchecked. Imported by the server: stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional

from .registry import BuildOptions, ModelSpec

MANIFEST = "etserve.json"
MANIFEST_VERSION = 1


class ManifestError(ValueError):
    """A model directory whose files do not match its manifest (or whose manifest is unreadable).

    The message names the file with its path (for the log); `public` names it without the
    path, for the open /health route."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.public = f"model directory refused: {path.name} {problem}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _payload(directory: Path) -> list[Path]:
    """The files a manifest describes: every regular file but itself and hidden ones."""
    return sorted(p for p in directory.iterdir() if p.is_file() and p.name != MANIFEST and not p.name.startswith("."))


def write_manifest(directory: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """Write `directory`'s etserve.json: `fields` plus the size and SHA-256 of each file in it."""
    files = _payload(directory)
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        **fields,
        "files": {f.name: f.stat().st_size for f in files},
        "sha256": {f.name: sha256_file(f) for f in files},
    }
    _write(directory, manifest)
    return manifest


def _write(directory: Path, manifest: dict[str, Any]) -> None:
    tmp = directory / f".{MANIFEST}.tmp"
    tmp.write_text(manifest_text(manifest))
    os.replace(tmp, directory / MANIFEST)


def manifest_text(manifest: dict[str, Any]) -> str:
    return json.dumps(manifest, indent=2) + "\n"


def read_manifest(directory: Path) -> Optional[dict[str, Any]]:
    """The parsed etserve.json of `directory`, or None if it has none or it does not parse."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def manifest_matches(manifest: Optional[dict[str, Any]], spec: ModelSpec, options: BuildOptions) -> bool:
    """Whether a manifest describes a complete build of `spec` with `options`."""
    if not manifest:
        return False
    return (
        manifest.get("manifest_version") == MANIFEST_VERSION
        and manifest.get("name") == spec.name
        and manifest.get("max_seq_len") == options.max_seq_len
        and manifest.get("quantize") == options.quantize
        and manifest.get("custom_ops") == options.custom_ops
        and manifest.get("embedding_quantize", "none") == options.embedding_quantize
        and manifest.get("kv_cache", "fp32") == options.kv_cache
        and manifest.get("output_quantize", "same") == options.output_quantize
        and (options.quantize != "8da4w" or manifest.get("linear_kernel", "xnnpack") == options.linear_kernel)
        # int8 caches are built with smoothed keys (kv_smoothing.py): an older int8 build is rebuilt
        and (options.kv_cache != "int8" or bool(manifest.get("kv_smoothing")))
        and manifest.get("group_size") == (spec.group_size if options.quantize != "none" else None)
    )


def _load_for_check(directory: Path) -> Optional[dict[str, Any]]:
    path = directory / MANIFEST
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise ManifestError(path, f"cannot be read ({e})") from None
    try:
        manifest = json.loads(text)
    except ValueError as e:
        raise ManifestError(path, f"is not valid JSON ({e})") from None
    if not isinstance(manifest, dict):
        raise ManifestError(path, "is not a JSON object")
    if manifest.get("manifest_version") != MANIFEST_VERSION:
        raise ManifestError(path, f"has manifest_version {manifest.get('manifest_version')!r}; "
                                  f"this etserve reads version {MANIFEST_VERSION}")
    files, sums = manifest.get("files"), manifest.get("sha256", {})
    if not isinstance(files, dict) or not files or not isinstance(sums, dict):
        raise ManifestError(path, "does not list the directory's files (\"files\", \"sha256\")")
    entries = [(name, value, int) for name, value in files.items()] + \
              [(name, value, str) for name, value in sums.items()]
    for name, value, kind in entries:
        if Path(name).name != name or name in (".", "..", MANIFEST):
            raise ManifestError(path, f"lists {name!r}, which is not a file name in its directory")
        if type(value) is not kind:  # noqa: E721 (a bool is not a size)
            raise ManifestError(path, f"has a bad entry for {name!r}: {value!r}")
    unlisted = sorted(set(sums) - set(files))
    if unlisted:
        raise ManifestError(path, f"has checksums for files it does not list: {', '.join(unlisted)}")
    return manifest


def check_model_dir(directory: Path) -> Optional[dict[str, Any]]:
    """The manifest of `directory` once every file it lists is there with its recorded size and
    SHA-256; None if the directory has no manifest. Raises ManifestError naming the first file
    that does not match (sizes are checked for all files before any is hashed)."""
    manifest = _load_for_check(directory)
    if manifest is None:
        return None
    files: dict[str, int] = manifest["files"]
    for name, size in sorted(files.items(), key=lambda item: item[1]):
        path = directory / name
        if not path.is_file():
            raise ManifestError(path, f"is missing: {MANIFEST} lists it")
        actual = path.stat().st_size
        if actual != size:
            raise ManifestError(path, f"has {actual} bytes where {MANIFEST} says {size}: "
                                      "truncated, or from another build")
    for name, digest in sorted(manifest.get("sha256", {}).items(), key=lambda item: files[item[0]]):
        path = directory / name
        if sha256_file(path) != digest:
            raise ManifestError(path, f"does not match its SHA-256 in {MANIFEST}: corrupted, or from another build")
    return manifest


def check_program(manifest: dict[str, Any], pte: Path, max_seq_len: int, vocab_size: int) -> None:
    """What the loaded .pte says about itself agrees with its manifest."""
    for key, actual in (("max_seq_len", max_seq_len), ("vocab_size", vocab_size)):
        expected = manifest.get(key)
        if expected is not None and expected != actual:
            raise ManifestError(pte, f"has {key} {actual} where {MANIFEST} says {expected}: "
                                     "the manifest is from another build")


def with_checksums(directory: Path) -> Optional[dict[str, Any]]:
    """check_model_dir(), plus the files' SHA-256 when the manifest was written before checksums
    were recorded (computed, not written: see add_checksums)."""
    manifest = check_model_dir(directory)
    if manifest is None or manifest.get("sha256"):
        return manifest
    if sorted(manifest["files"]) != [p.name for p in _payload(directory)]:
        raise ManifestError(directory / MANIFEST, "does not list exactly the files of its directory")
    return {**manifest, "sha256": {name: sha256_file(directory / name) for name in sorted(manifest["files"])}}


def add_checksums(directory: Path) -> bool:
    """Give a manifest written before checksums were recorded its files' SHA-256, once its sizes
    match (a build is otherwise never rewritten). True if the manifest was updated."""
    manifest = check_model_dir(directory)
    if manifest is None or manifest.get("sha256"):
        return False
    manifest = with_checksums(directory)
    assert manifest is not None
    _write(directory, manifest)
    return True
