"""native/check/kernel_check: the attention and 4-bit linear kernels at this directory's shapes
against float64 references, as a static program (no Python, no ExecuTorch runtime), so that the
builds this machine cannot load run too: cross-built for aarch64 and run under qemu-aarch64
(`make -C native ARCH=aarch64 check`). The cross compiler and qemu-user-static are Debian packages
that `make test` installs (the top Makefile's system-packages)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parents[2] / "native"


def make_check(*args, timeout=600):
    proc = subprocess.run(["make", "-C", str(NATIVE), "--no-print-directory", f"PYTHON={sys.executable}",
                           *args, "check"], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def test_kernel_check_on_this_machine():
    out = make_check()
    assert ", 0 failed" in out.splitlines()[-1]


def test_kernel_check_on_aarch64_under_emulation():
    missing = [t for t in ("aarch64-linux-gnu-g++", "qemu-aarch64-static") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"no {' and '.join(missing)} (Debian g++-aarch64-linux-gnu, qemu-user-static: make system-packages)")
    out = make_check("ARCH=aarch64")
    last = out.splitlines()[-1]
    assert last.startswith("kernel_check (") and ", 0 failed" in last, out[-2000:]
