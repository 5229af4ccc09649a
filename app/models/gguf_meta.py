"""Read GGUF metadata as plain Python values (build time; needs the ``gguf`` package)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def open_gguf(path: Path):
    """The GGUF at ``path`` (memory-mapped) as ``gguf.GGUFReader`` gives it: ``gguf_header.GgufFile``,
    or the reader itself for a file that one does not read (a big-endian GGUF)."""
    from .gguf_header import GgufFile

    try:
        return GgufFile(path)
    except ValueError:
        import gguf

        return gguf.GGUFReader(str(path))


def read_metadata(reader) -> dict[str, Any]:
    """All key/value fields of a GGUF (arrays as lists), without the ``GGUF.*`` header fields."""
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        out[key] = field.contents()
    return out


def arch_value(md: dict[str, Any], key: str, default: Any = None) -> Any:
    """``<architecture>.<key>`` from the metadata."""
    return md.get(f"{md['general.architecture']}.{key}", default)
