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


@pytest.fixture(scope="session")
def run_pte(etserve_lib):
    """run_pte(path, steps, vocab): a .pte opened by our runtime (ets_model_open), each
    (start position, tokens) step forwarded (ets_forward), the logits after each (ets_get_logits)
    as one array of shape [steps, vocab]; closed again."""
    import numpy as np

    L = etserve_lib
    c_i64 = ctypes.c_int64
    L.ets_model_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    L.ets_model_open.restype = ctypes.c_void_p
    L.ets_model_close.argtypes = [ctypes.c_void_p]
    L.ets_model_error.argtypes = [ctypes.c_void_p]
    L.ets_model_error.restype = ctypes.c_char_p
    L.ets_forward.argtypes = [ctypes.c_void_p, ctypes.POINTER(c_i64), c_i64, c_i64]
    L.ets_forward.restype = ctypes.c_int
    L.ets_get_logits.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), c_i64]
    L.ets_get_logits.restype = ctypes.c_int

    def run(path, steps, vocab):
        err = ctypes.create_string_buffer(4096)
        m = L.ets_model_open(str(path).encode(), err, len(err))
        assert m, err.value.decode()
        try:
            out = np.empty((len(steps), vocab), np.float32)
            for row, (start, toks) in zip(out, steps):
                arr = (c_i64 * len(toks))(*toks)
                assert L.ets_forward(m, arr, len(toks), start) == 0, L.ets_model_error(m).decode()
                assert L.ets_get_logits(m, row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), vocab) == 0
            return out
        finally:
            L.ets_model_close(m)

    return run
