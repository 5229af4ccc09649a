"""Packaging: a wheel of etserve is a platform wheel carrying the native runtime.

`pip wheel . --no-deps --no-build-isolation` (or `make wheel`) compiles native/ into
libetserve.so against the pinned executorch of the building environment and ships it in
app/_native/ with the few ExecuTorch runtime libraries it links (found beside it through an
$ORIGIN run path), so the serving box needs neither a compiler nor the executorch wheel.
Everything else is declared in setup.cfg. Editable installs (`make setup`) build nothing: the
source tree's own native/build is used there.

Environment knobs (for another architecture, see docs/deployment.md, "Other architectures"):
  CXX, CXXFLAGS               compiler and flags (default: -O3 with a portable -march per arch)
  ETSERVE_EXECUTORCH_DIR      an executorch package directory (e.g. from an unpacked aarch64
                              wheel) instead of the one this Python imports
  ETSERVE_WHEEL_PLAT          the wheel's platform tag (default: this machine's, e.g. linux_x86_64)
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
NATIVE = ROOT / "native"
PACKAGE_DIR = "app/_native"  # inside the installed package; app/engine/native.py looks here
# Flags for the wheel's own code (the ExecuTorch libraries bring their own dispatch). No -march on
# x86-64: native/Makefile compiles the kernels once per CPU tier (scalar, AVX2, AVX-512/AMX) and the
# library picks one at load, so one wheel runs on any x86-64 CPU.
PORTABLE_CXXFLAGS = {"x86_64": "-O3", "aarch64": "-O3 -march=armv8-a"}


def _wheel_platform() -> str:
    return os.environ.get("ETSERVE_WHEEL_PLAT") or sysconfig.get_platform().replace("-", "_").replace(".", "_")


def _executorch_dir() -> Path:
    explicit = os.environ.get("ETSERVE_EXECUTORCH_DIR")
    if explicit:
        return Path(explicit).resolve()
    try:
        import executorch
    except ImportError:
        raise SystemExit(
            "building the etserve wheel needs the pinned executorch (its headers and runtime libraries):\n"
            "  pip install --no-deps executorch==PIN, then `pip wheel . --no-deps --no-build-isolation`\n"
            "(make wheel does this), or set ETSERVE_EXECUTORCH_DIR to an unpacked executorch wheel's "
            "executorch/ directory") from None
    return Path(executorch.__path__[0]).resolve()


def _check_version(et_dir: Path, pin: str) -> None:
    found = sorted(p.name for p in et_dir.parent.glob("executorch-*.dist-info"))
    versions = [re.sub(r"^executorch-(.*)\.dist-info$", r"\1", name) for name in found]
    if pin not in versions:
        raise SystemExit(f"the wheel is built against executorch=={pin} (setup.cfg's pin), "
                         f"but {et_dir} is {', '.join(versions) or 'of unknown version'}")


def _needed(library: Path) -> list[str]:
    """The DT_NEEDED entries of an ELF shared library (readelf reads any architecture)."""
    out = subprocess.run(["readelf", "-d", str(library)], check=True, capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def _runtime_libraries(library: Path, lib_dir: Path) -> list[Path]:
    """The libraries of `lib_dir` that `library` loads, directly or through each other."""
    found: dict[str, Path] = {}
    todo = [library]
    while todo:
        for name in _needed(todo.pop()):
            candidate = lib_dir / name
            if name not in found and candidate.is_file():
                found[name] = candidate
                todo.append(candidate)
    return [found[name] for name in sorted(found)]


def build_native(dest: Path, pin: str) -> None:
    """libetserve.so and the ExecuTorch libraries it needs, into `dest`."""
    et_dir = _executorch_dir()
    _check_version(et_dir, pin)
    plat = _wheel_platform()
    arch = "aarch64" if "aarch64" in plat or "arm64" in plat else platform.machine()
    cxxflags = os.environ.get("CXXFLAGS") or PORTABLE_CXXFLAGS.get(arch, "-O3")
    cxx = os.environ.get("CXX", "g++")
    # One work directory per configuration: make rebuilds only what changed since the last wheel.
    key = hashlib.sha256("\0".join((plat, cxx, cxxflags, str(et_dir))).encode()).hexdigest()[:10]
    work = ROOT / "build" / f"native-{plat}-{key}"
    work.mkdir(parents=True, exist_ok=True)
    for sub in ("include", "src"):  # a fresh copy (file times kept) so removed sources go too
        shutil.rmtree(work / sub, ignore_errors=True)
        shutil.copytree(NATIVE / sub, work / sub)
    shutil.copy2(NATIVE / "Makefile", work / "Makefile")
    # On every core, as a make of its own: a calling make's job slots (MAKEFLAGS) do not pass through
    # pip to here, and a sub-make that inherits MAKEFLAGS without them runs one job at a time (a
    # fresh wheel's three kernel tiers: 45 s, against 25 s on two cores).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.update(CXXFLAGS=cxxflags, CXX=cxx)
    subprocess.run(["make", "-C", str(work), "--no-print-directory", f"-j{os.cpu_count() or 1}", "build/libetserve.so",
                    f"PYTHON={sys.executable}", f"ET_DIR={et_dir}", "RPATH=\\$$ORIGIN"],
                   check=True, env=env)
    library = work / "build" / "libetserve.so"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for path in [library, *_runtime_libraries(library, et_dir / "lib")]:
        shutil.copy2(path, dest / path.name)
    licence = et_dir.parent / f"executorch-{pin}.dist-info" / "licenses" / "LICENSE"
    if licence.is_file():
        shutil.copy2(licence, dest / "LICENSE.executorch")


def _executorch_pin(distribution) -> str:
    for requirement in distribution.extras_require.get("build", []):
        m = re.fullmatch(r"\s*executorch\s*==\s*([^\s;]+)\s*", requirement)
        if m:
            return m.group(1)
    raise SystemExit("setup.cfg's build extra must pin executorch==VERSION")


class BuildPyWithNative(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            build_native(Path(self.build_lib) / PACKAGE_DIR, _executorch_pin(self.distribution))


class NativeDistribution(Distribution):
    """Holds native code, so its wheel is a platform wheel installed into platlib."""

    def has_ext_modules(self) -> bool:
        return True


class PlatformWheel(bdist_wheel):
    """py3-none-PLATFORM: any Python 3 (the library is loaded by ctypes, not as an extension)."""

    def get_tag(self) -> tuple[str, str, str]:
        return "py3", "none", _wheel_platform()


setup(distclass=NativeDistribution, cmdclass={"build_py": BuildPyWithNative, "bdist_wheel": PlatformWheel})
