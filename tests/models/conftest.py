"""Shared, session-cached GGUF metadata of the installed model packages."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def gguf_metadata():
    """``load(name) -> (spec, gguf path, reader, metadata)``; skips if the package is missing."""
    pytest.importorskip("gguf")
    from app.models.gguf_meta import open_gguf, read_metadata
    from app.models.gguf_source import locate_gguf
    from app.models.registry import get_spec

    cache = {}

    def load(name):
        if name not in cache:
            spec = get_spec(name)
            try:
                path = locate_gguf(spec)
            except FileNotFoundError as e:
                pytest.skip(str(e))
            reader = open_gguf(path)
            cache[name] = (spec, path, reader, read_metadata(reader))
        return cache[name]

    return load
