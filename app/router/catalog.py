"""The models a --models-dir offers: each directory in it (or symlink to one) holding a model.pte,
named by its directory. Read again on each listing, so a model copied in later is offered without
a restart; nothing in the directory can stop the server from starting (what is not a model is
skipped, and a missing directory offers nothing)."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("etserve")

PTE = "model.pte"


def discover(models_dir: Path) -> dict[str, Path]:
    """name -> model directory, sorted by name."""
    try:
        entries = sorted(models_dir.iterdir(), key=lambda p: p.name)
    except OSError as e:
        log.error("--models-dir %s cannot be read: %s", models_dir, e.strerror or e)
        return {}
    found: dict[str, Path] = {}
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            if (entry / PTE).is_file():
                found[entry.name] = entry
        except OSError:  # a dangling or unreadable entry: not a model
            continue
    return found


def size_of(directory: Path) -> int:
    """Bytes a model counts against --models-mib: its .pte file (0 if it is gone)."""
    try:
        return (directory / PTE).stat().st_size
    except OSError:
        return 0
