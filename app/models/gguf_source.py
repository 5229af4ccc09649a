"""Locate a model's GGUF inside its installed Python package(s), joining split parts once."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .registry import ModelSpec, cache_root

GGUF_MAGIC = b"GGUF"


def package_dir(package: str) -> Path:
    """Directory of an installed package, found without importing it (its ``__init__`` may be heavy)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        dist = package.replace("_", "-")
        raise FileNotFoundError(f"package {package!r} is not installed (pip install {dist})")
    return Path(list(spec.submodule_search_locations)[0])


def part_paths(spec: ModelSpec) -> list[Path]:
    """The GGUF file, or its parts in join order (a spec without packages names its file)."""
    if not spec.packages:
        paths = [Path(f) for f in spec.gguf_files]
        for p in paths:
            if not p.is_file():
                raise FileNotFoundError(f"missing GGUF file {p}")
        return paths
    paths = [package_dir(pkg) / rel for pkg, rel in zip(spec.packages, spec.gguf_files)]
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"missing GGUF data file {p}")
    return paths


def check_magic(path: Path) -> None:
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ValueError(f"{path} does not start with {GGUF_MAGIC!r}")


def locate_gguf(spec: ModelSpec) -> Path:
    """Path of the model's GGUF; split parts are joined into ``<cache>/gguf/<name>.gguf`` once."""
    parts = part_paths(spec)
    if not spec.joined:
        check_magic(parts[0])
        return parts[0]
    target = cache_root() / "gguf" / f"{spec.name}.gguf"
    expected = sum(p.stat().st_size for p in parts)
    if target.is_file() and target.stat().st_size == expected:
        check_magic(target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    while chunk := f.read(1 << 24):
                        out.write(chunk)
        check_magic(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target

