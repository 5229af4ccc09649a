"""native/check/kernel_check: the attention and 4-bit linear kernels at this directory's shapes
against float64 references, as a static program (no Python, no ExecuTorch runtime), so that the
builds this machine cannot load run too: cross-built for aarch64 and run under qemu-aarch64
(`make -C native ARCH=aarch64 check`). The cross compiler and qemu-user-static are Debian packages
that `make test` installs (the top Makefile's system-packages)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parents[2] / "native"


def make_check(*args, timeout=600, target="check"):
    # on every core, as a make of its own: under `make test` the environment holds the top make's
    # MAKEFLAGS without its job slots, which would hold this one to a job at a time
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    proc = subprocess.run(["make", "-C", str(NATIVE), "--no-print-directory", f"-j{os.cpu_count() or 1}",
                           f"PYTHON={sys.executable}", *args, target], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def test_kernel_check_on_this_machine():
    out = make_check()
    assert ", 0 failed" in out.splitlines()[-1]


def need_aarch64_tools():
    missing = [t for t in ("aarch64-linux-gnu-g++", "qemu-aarch64-static") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"no {' and '.join(missing)} (Debian g++-aarch64-linux-gnu, qemu-user-static: make system-packages)")


def test_kernel_check_on_aarch64_under_emulation():
    """`make ARCH=aarch64 check`: the cross build, run under qemu's default CPU ("max", with the dot
    products): the dotprod set's kernels."""
    need_aarch64_tools()
    out = make_check("ARCH=aarch64")
    last = out.splitlines()[-1]
    assert last.startswith("kernel_check (neon-dotprod kernels)") and ", 0 failed" in last, out[-2000:]


CHECK_AARCH64 = NATIVE / "build" / "check-aarch64" / "kernel_check"


def run_aarch64(cpu: str, isa: str, *args: str) -> subprocess.CompletedProcess:
    need_aarch64_tools()
    make_check("ARCH=aarch64", target="build/check-aarch64/kernel_check")  # built, run below
    out = subprocess.run(["qemu-aarch64-static", "-cpu", cpu, str(CHECK_AARCH64), *args], capture_output=True,
                         text=True, timeout=600, env={"ETSERVE_ISA": isa, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    return out


# (qemu CPU model, ETSERVE_ISA, the kernel set that must run), the whole check: qemu's Cortex-A53
# has only Advanced SIMD (no ARMv8.2 dot products, HWCAP_ASIMDDP); ETSERVE_ISA=scalar forces the
# portable loops. (The dotprod set runs in the test above.) On aarch64 kernel_check also holds the
# NEON sets' 4-bit linear to the scalar set's bits.
@pytest.mark.parametrize("cpu,isa,kernels", [
    ("cortex-a53", "", "neon"),
    ("max", "scalar", "scalar"),
])
def test_each_aarch64_tier_passes_the_kernel_check_under_emulation(cpu, isa, kernels):
    out = run_aarch64(cpu, isa)
    assert f"kernel_check ({kernels} kernels)" in out.stdout and ", 0 failed" in out.stdout, out.stdout[-2000:]


# The choice alone (`kernel_check --tier`: no cases; each set's cases run above): a lower set asked
# for on a bigger CPU, and a set the CPU lacks refused with a message naming it (an UDOT on a
# Cortex-A53 would be SIGILL).
@pytest.mark.parametrize("cpu,isa,kernels,refused", [
    ("max", "neon", "neon", False),
    ("cortex-a53", "scalar", "scalar", False),
    ("cortex-a53", "neon-dotprod", "neon", True),
])
def test_each_aarch64_cpu_gets_the_kernel_set_asked_for_or_the_best_it_has(cpu, isa, kernels, refused):
    out = run_aarch64(cpu, isa, "--tier")
    assert out.stdout.strip() == f"kernel_check ({kernels} kernels): tier only", out.stdout[-2000:]
    message = f"ETSERVE_ISA={isa}: this CPU or OS lacks it; using {kernels}"
    assert (message in out.stderr) == refused, out.stderr[-2000:]


def test_only_the_dotprod_set_has_dot_product_instructions():
    """The aarch64 objects outside the dotprod kernel set are ARMv8-A: no SDOT/UDOT in them; and the
    NEON sets' files hold NEON code (the scalar set's are empty)."""
    need_aarch64_tools()
    objdump = shutil.which("aarch64-linux-gnu-objdump")
    if objdump is None:
        pytest.skip("no aarch64-linux-gnu-objdump (Debian binutils-aarch64-linux-gnu)")
    make_check("ARCH=aarch64", target="build/check-aarch64/kernel_check")  # built, run below
    objs = NATIVE / "build" / "obj-aarch64"

    def disasm(paths):
        return subprocess.run([objdump, "-d", *map(str, paths)], capture_output=True, text=True, check=True).stdout

    others = [p for p in objs.rglob("*.o") if p.parent.name != "dotprod"]
    others += list((NATIVE / "build" / "check-aarch64").glob("*.o"))
    assert len(others) > 10
    assert not [line for line in disasm(others).splitlines() if "\tudot" in line or "\tsdot" in line]
    assert "\tudot" in disasm([objs / "dotprod" / "linear_q4_neon.o"])
    for f in ("attention_decode_neon.o", "attention.o"):  # exact int8 scores, decode and prefill
        assert "\tsdot" in disasm([objs / "dotprod" / f]), f
        assert "\tsadalp" in disasm([objs / "neon" / f]), f  # the widening multiplies' sums
    neon = disasm([objs / "neon" / "linear_q4_neon.o", objs / "neon" / "attention_decode_neon.o"])
    assert "umlal" in neon and "fmla" in neon
    assert "\tfmla" not in disasm([objs / "scalar" / "linear_q4_neon.o", objs / "scalar" / "attention_decode_neon.o"])


X86 = subprocess.run(["uname", "-m"], capture_output=True, text=True).stdout.strip() == "x86_64"
CHECK_X86 = NATIVE / "build" / "check-x86_64" / "kernel_check"
TIER_ISA = {"scalar": "scalar", "avx2": "avx2", "avx512": "avx512-vnni"}


def host_tier():
    flags = Path("/proc/cpuinfo").read_text().split("\nflags")[1].split("\n")[0].split()
    if all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512vbmi")):
        return "avx512"
    return "avx2" if all(f in flags for f in ("avx2", "fma", "f16c", "bmi2", "movbe")) else "scalar"


@pytest.mark.skipif(not X86, reason="x86-64 tiers")
@pytest.mark.parametrize("tier", ["scalar", "avx2", "avx512"])
def test_each_x86_tier_the_host_has_passes_the_kernel_check(tier):
    """One library, every tier: ETSERVE_ISA forces a lower tier (cpu_tiers.cpp), so a big host
    checks the kernels of the smaller ones too."""
    order = ["scalar", "avx2", "avx512"]
    if order.index(tier) > order.index(host_tier()):
        pytest.skip(f"this CPU has no {tier}")
    make_check()
    out = subprocess.run([str(CHECK_X86)], capture_output=True, text=True, timeout=300,
                         env={"ETSERVE_ISA": tier, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert f"kernel_check ({TIER_ISA[tier]} kernels)" in out.stdout and ", 0 failed" in out.stdout


@pytest.mark.skipif(not X86, reason="x86-64 tiers")
def test_a_cpu_without_avx_picks_the_scalar_tier_under_emulation():
    """A baseline x86-64 CPU (qemu's Nehalem model: SSE4.2, no AVX) starts on the scalar kernels
    instead of crashing. (qemu's TCG executes AVX even on that model, so what this proves is the
    choice, `kernel_check --tier`; the scalar set's cases run in the tier test above, and the next
    test proves the scalar set and the rest have no vector extensions in them.)"""
    if shutil.which("qemu-x86_64-static") is None:
        pytest.skip("no qemu-x86_64-static (Debian qemu-user-static: make system-packages)")
    make_check()
    out = subprocess.run(["qemu-x86_64-static", "-cpu", "Nehalem", str(CHECK_X86), "--tier"], capture_output=True,
                         text=True, timeout=300, env={"ETSERVE_ISA": "avx2", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.strip() == "kernel_check (scalar kernels): tier only", out.stdout[-2000:]
    # asked for a tier the CPU lacks: refused with a message naming it, and the best it has runs
    assert "ETSERVE_ISA=avx2: this CPU or OS lacks it; using scalar" in out.stderr, out.stderr[-2000:]


@pytest.mark.skipif(not X86, reason="x86-64 tiers")
def test_the_baseline_objects_use_no_avx():
    """Everything outside the avx2 and avx512 kernel sets is compiled for x86-64 itself: no
    instruction of theirs touches a ymm or zmm register (AVX, AVX2, AVX-512) or a tile (AMX)."""
    make_check()
    scalar = list((NATIVE / "build" / "obj" / "scalar").glob("*.o"))
    kernels = {p.stem for p in scalar}  # built per tier: a top-level object of that name is a stale one
    objs = [p for p in (NATIVE / "build" / "obj").glob("*.o") if p.stem not in kernels] + scalar
    assert len(objs) > 10
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", *map(str, objs)], capture_output=True, text=True,
                         check=True).stdout
    bad = [line for line in out.splitlines() if "%ymm" in line or "%zmm" in line or "%k" in line.split("#")[0]
           or "tmm" in line]
    assert not bad, bad[:20]
