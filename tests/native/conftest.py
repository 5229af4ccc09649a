"""Fixtures for the native library tests: build (make -C native) and load
libetserve.so, or the test library built beside it (libetserve_test.so: the
kernels' test entry points, with libetserve.so as its dependency), with
ctypes. ETSERVE_NATIVE_LIB=/path/to/lib.so (the variable the app reads too) skips the
build and loads that file (and the libetserve_test.so next to it) instead, for iterating
on a scratch build."""

import ctypes
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
DEFAULT_LIB = NATIVE / "build" / "libetserve.so"


def _lib_path() -> Path:
    override = os.environ.get("ETSERVE_NATIVE_LIB")
    if override:
        return Path(override)
    proc = subprocess.run(
        ["make", "-C", str(NATIVE)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.fail(f"make -C native failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return DEFAULT_LIB


@pytest.fixture(scope="session")
def etserve_lib_path() -> Path:
    path = _lib_path()
    if not path.exists():
        pytest.fail(f"{path} does not exist")
    return path


@pytest.fixture(scope="session")
def etserve_lib(etserve_lib_path) -> ctypes.CDLL:
    return ctypes.CDLL(str(etserve_lib_path))


@pytest.fixture(scope="session")
def etserve_test_lib(etserve_lib_path) -> ctypes.CDLL:
    """libetserve_test.so; its symbols and those of libetserve.so (its dependency) resolve through it."""
    path = etserve_lib_path.with_name("libetserve_test.so")
    if not path.exists():
        pytest.fail(f"{path} does not exist")
    return ctypes.CDLL(str(path))
