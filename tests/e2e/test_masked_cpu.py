"""The server as a smaller x86-64 host runs it, on this one: native/build/libcpu_mask.so, preloaded
with ETSERVE_CPU_MASK=avx2 or x86-64, shows the whole process (our library, ExecuTorch, XNNPACK,
libgcc) a CPU without AVX-512 or without AVX at all, through Linux's CPUID faulting. Where
ETSERVE_ISA reaches our kernels only, this reaches every library's choice, so a big host runs
what an AVX2 box or a baseline x86-64 box would choose, at native speed, on the real model.
(The instructions themselves still run on this CPU: whether code uses instructions the CPU lacks
without asking is what the qemu test of test_kernel_check checks.)"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from e2e.servers import ROOT, Server

MASK = ROOT / "native" / "build" / "libcpu_mask.so"


def _flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.split(":")[0].strip() == "flags":
            return set(line.split(":", 1)[1].split())
    return set()


FLAGS = _flags() if platform.machine() == "x86_64" else set()
pytestmark = pytest.mark.skipif("cpuid_fault" not in FLAGS,
                                reason="needs x86-64 with CPUID faulting (the cpuid_fault flag)")


@pytest.fixture(scope="module", autouse=True)
def mask_built():
    proc = subprocess.run(["make", "-C", str(ROOT / "native"), "--no-print-directory", "build/libcpu_mask.so"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def masked(mask: str) -> dict[str, str]:
    return {"ETSERVE_CPU_MASK": mask, "LD_PRELOAD": str(MASK)}


def run(env: dict[str, str], code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


TIER = "from app.engine import native; print(native.library().ets_vector_isa().decode())"


def test_the_library_picks_the_masked_cpus_tier():
    assert run(masked("x86-64"), TIER).stdout.strip() == "scalar"
    if "avx2" in FLAGS:
        assert run(masked("avx2"), TIER).stdout.strip() == "avx2"
    if "avx512f" in FLAGS:  # a tier above the mask is refused as on a CPU that lacks it
        assert run({}, TIER).stdout.strip() != "avx2"
        out = run({**masked("avx2"), "ETSERVE_ISA": "avx512"}, TIER)
        assert out.stdout.strip() == "avx2"
        assert "ETSERVE_ISA=avx512: this CPU or OS lacks it; using avx2" in out.stderr, out.stderr[-2000:]


def test_an_unknown_mask_stops_the_process_at_load():
    out = run(masked("avx3"), "print('ran')")
    assert out.returncode == 3 and "ran" not in out.stdout
    assert "ETSERVE_CPU_MASK=avx3: expected avx2 or x86-64" in out.stderr


def completion(srv: Server) -> dict:
    r = requests.post(srv.base_url + "/v1/completions", timeout=120,
                      json={"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "logprobs": 1})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]


@pytest.fixture(scope="module")
def answers(model_dir):
    """The same greedy completion from servers on: this CPU's avx2 kernels (ETSERVE_ISA), the AVX2
    mask, the baseline x86-64 mask; and their start-up logs."""
    out = {}
    for name, env in (("isa", {"ETSERVE_ISA": "avx2"}), ("avx2", masked("avx2")), ("x86-64", masked("x86-64"))):
        if name != "x86-64" and "avx2" not in FLAGS:
            continue
        srv = Server(model_dir, env)
        try:
            srv.wait_ready()
            out[name] = (completion(srv), srv.log_path.read_text(errors="replace"))
        finally:
            srv.stop()
    return out


def test_a_server_on_a_baseline_x86_64_cpu_serves_the_same_tokens(answers, server):
    """Started on what a pre-AVX CPU chooses (our scalar kernels, XNNPACK's SSE ones), the server
    answers, token for token as this host's best tier does, the log naming the scalar tier."""
    logprobs, log = answers["x86-64"]
    assert "CPU tier: scalar kernels" in log, log[-3000:]
    best = completion(server)
    assert logprobs["tokens"] == best["tokens"]
    for a, b in zip(logprobs["token_logprobs"], best["token_logprobs"]):
        assert abs(a - b) < 1e-2


def test_the_avx2_mask_reaches_xnnpack_where_etserve_isa_does_not(answers):
    """Our kernels are the avx2 set in both servers; XNNPACK's choice is what differs: with
    AVX-512 hidden its float sums take another order, and the logprobs' last bits change."""
    if "avx512f" not in FLAGS:
        pytest.skip("no AVX-512 here: the mask hides nothing XNNPACK would use")
    isa, isa_log = answers["isa"]
    masked_run, masked_log = answers["avx2"]
    assert "CPU tier: avx2 kernels" in isa_log and "CPU tier: avx2 kernels" in masked_log
    assert isa["tokens"] == masked_run["tokens"]
    assert isa["token_logprobs"] != masked_run["token_logprobs"]
