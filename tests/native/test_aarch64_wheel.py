"""The aarch64 wheel itself (issue 37): `make wheel-aarch64` cross-builds it; its libetserve.so,
loaded from the unpacked wheel as a serving box would (the ExecuTorch libraries it ships found
through its RPATH), opens the test model's .pte and runs a forward call under qemu-aarch64, on
each aarch64 kernel set, and gives the logits this machine's library gives.

No aarch64 Python is needed: native/check/wheel_smoke.cpp, cross-built here, dlopens the library
and calls the C ABI (etserve.h) that app/engine/native.py calls through ctypes. The cross
compiler and qemu-user-static are Debian packages that `make test` installs (the top Makefile's
system-packages); the aarch64 ExecuTorch wheel is downloaded once into build/ (network on the
first run)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKENS = [1, 504, 3458, 282, 4649, 314, 253, 1127]  # any ids the test model's vocabulary has
CXX = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64-static"
SYSROOT = Path("/usr/aarch64-linux-gnu")  # the cross toolchain's libc and libstdc++ (Debian)


def _need_tools() -> None:
    missing = [t for t in (CXX, QEMU, "readelf") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"no {' and '.join(missing)} (Debian g++-aarch64-linux-gnu, qemu-user-static: "
                    "make system-packages)")


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory) -> Path:
    """`make wheel-aarch64`'s wheel, unpacked; its native directory."""
    _need_tools()
    proc = subprocess.run(["make", "-C", str(ROOT), "--no-print-directory", "wheel-aarch64",
                           f"PY={sys.executable}", f"PIP={sys.executable} -m pip"],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheels = sorted((ROOT / "dist").glob("etserve-*-linux_aarch64.whl"))
    assert len(wheels) == 1, wheels
    out = tmp_path_factory.mktemp("wheel-aarch64")
    with zipfile.ZipFile(wheels[0]) as z:
        z.extractall(out)
    native = out / "app" / "_native"
    for f in native.iterdir():
        f.chmod(0o755)
    return native


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    _need_tools()
    exe = tmp_path_factory.mktemp("smoke") / "wheel_smoke"
    subprocess.run([CXX, "-O1", "-std=c++17", "-I", str(ROOT / "native" / "include"),
                    str(ROOT / "native" / "check" / "wheel_smoke.cpp"), "-o", str(exe), "-ldl"],
                   check=True, timeout=300)
    return exe


def _machine(path: Path) -> str:
    out = subprocess.run(["readelf", "-h", str(path)], check=True, capture_output=True, text=True).stdout
    return re.search(r"Machine:\s+(.+)", out).group(1).strip()


def test_the_wheel_ships_aarch64_libraries_that_find_each_other(unpacked):
    libs = sorted(unpacked.glob("*.so*"))
    assert unpacked / "libetserve.so" in libs and len(libs) > 1, libs
    assert {_machine(p) for p in libs} == {"AArch64"}
    dynamic = subprocess.run(["readelf", "-d", str(unpacked / "libetserve.so")], check=True, capture_output=True,
                             text=True).stdout
    assert "$ORIGIN" in dynamic
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    shipped = {p.name for p in libs}
    system = {n for n in needed if n not in shipped}
    assert all(re.match(r"lib(c|m|dl|pthread|rt|gcc_s|stdc\+\+)\.so", n) or n.startswith("ld-linux") for n in system), \
        system


# (qemu CPU model, the kernel set the library must choose): qemu's "max" has the dot products.
# (One CPU: this is the wheel's packaging and a real model's run; the test model is fp32, so the
# sets differ little here. Each set's kernels and the choice on a Cortex-A53 are
# tests/native/test_kernel_check.py's.)
@pytest.mark.parametrize("cpu,isa", [("max", "neon-dotprod")])
def test_the_wheels_library_runs_the_test_model_under_emulation(unpacked, smoke, model_dir, tmp_path, cpu, isa):
    out = tmp_path / "logits.f32"
    env = {"PATH": "/usr/bin:/bin", "QEMU_LD_PREFIX": str(SYSROOT)}
    proc = subprocess.run([QEMU, "-cpu", cpu, str(smoke), str(unpacked / "libetserve.so"),
                           str(model_dir / "model.pte"), str(out), *map(str, TOKENS)],
                          capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"isa {isa}\n" in proc.stdout, proc.stdout
    ours = np.fromfile(out, dtype=np.float32)
    from models.test_gguf_architectures import our_logits

    host = our_logits(model_dir, TOKENS)
    assert ours.shape == host.shape and np.isfinite(ours).all()
    assert ours.argmax() == host.argmax()
    rel = float(np.abs(ours - host).max() / np.abs(host).max())
    print(f"aarch64 wheel ({isa}) vs {os.uname().machine}: max |logit diff| / max |logit| {rel:.1e}")
    assert rel < 1e-3
