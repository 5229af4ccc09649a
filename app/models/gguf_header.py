"""The GGUF header alone, fast: scalar metadata and the tensor table, arrays skipped.

``gguf.GGUFReader`` parses every array element into its own numpy view (a 262,144-entry
vocabulary takes it 5 to 20 s on a loaded 2-core box); refusing a file by its architecture or
tensor types needs none of that. This reads the same layout (GGUF v2/v3, little-endian) with
``struct`` over a memory map, skipping array contents.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any, NamedTuple

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class TensorInfo(NamedTuple):
    name: str
    type_id: int
    shape: tuple[int, ...]  # GGUF order (fastest dimension first)
    offset: int = 0  # of its data, from Header.data_start


class Header(NamedTuple):
    metadata: dict[str, Any]  # scalars and strings; arrays as their length
    tensors: list[TensorInfo]
    data_start: int = 0  # where the tensor data begins (general.alignment applied)


def read_header(path: Path) -> Header:
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise ValueError(f"{Path(path).name} is empty, not a GGUF file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return parse_header(m, Path(path).name)


def parse_header(m, label: str = "the file") -> Header:
    """The header of a GGUF held in ``m`` (a memory map, or the first bytes of a file that holds the
    whole header, e.g. the first of a split file's parts). ValueError for anything else: a file
    that is not a GGUF, cut short, or with a field of no known type."""
    try:
        return _parse_header(m, label)
    except (struct.error, KeyError, IndexError, OverflowError, MemoryError) as e:
        raise ValueError(f"{label}: a truncated or corrupt GGUF header ({type(e).__name__}: {e})") from None


def _parse_header(m, label: str) -> Header:
    if m[:4] != b"GGUF":
        raise ValueError(f"{label} is not a GGUF file")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", m, 4)
    if version < 2:
        raise ValueError(f"{label}: GGUF version {version} is too old")
    pos = 24

    def string(pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", m, pos)
        return m[pos + 8:pos + 8 + n].decode("utf-8", errors="replace"), pos + 8 + n

    def skip(vtype: int, count: int, pos: int) -> int:
        if vtype == _STRING:
            for _ in range(count):
                (n,) = struct.unpack_from("<Q", m, pos)
                pos += 8 + n
            return pos
        if vtype == _ARRAY:
            for _ in range(count):
                etype, n = struct.unpack_from("<IQ", m, pos)
                pos = skip(etype, n, pos + 12)
            return pos
        return pos + struct.calcsize(_SCALARS[vtype]) * count

    md: dict[str, Any] = {}
    for _ in range(n_kv):
        key, pos = string(pos)
        (vtype,) = struct.unpack_from("<I", m, pos)
        pos += 4
        if vtype == _STRING:
            md[key], pos = string(pos)
        elif vtype == _ARRAY:
            etype, n = struct.unpack_from("<IQ", m, pos)
            pos = skip(etype, n, pos + 12)
            md[key] = n
        else:
            md[key] = struct.unpack_from(_SCALARS[vtype], m, pos)[0]
            pos += struct.calcsize(_SCALARS[vtype])
    tensors = []
    for _ in range(n_tensors):
        name, pos = string(pos)
        (n_dims,) = struct.unpack_from("<I", m, pos)
        shape = struct.unpack_from(f"<{n_dims}Q", m, pos + 4)
        pos += 4 + 8 * n_dims
        ttype, offset = struct.unpack_from("<IQ", m, pos)
        pos += 12
        tensors.append(TensorInfo(name, ttype, tuple(shape), offset))
    alignment = int(md.get("general.alignment", 32)) or 32
    return Header(md, tensors, (pos + alignment - 1) // alignment * alignment)
