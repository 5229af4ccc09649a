"""The bench's side of a worker process (bench/runtimes.py) holding one model in one runtime."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class WorkerError(RuntimeError):
    pass


CPU_MASK = ROOT / "native" / "build" / "libcpu_mask.so"


def masked_env(mask: str | None = None) -> dict[str, str]:
    """This process's environment, with native/build/libcpu_mask.so preloaded when
    ETSERVE_CPU_MASK (or `mask`, which sets it) asks for a smaller CPU (avx2, x86-64): the
    worker's every library (XNNPACK too, which ETSERVE_ISA does not reach) then chooses its
    kernels as on that CPU."""
    env = dict(os.environ)
    if mask:
        env["ETSERVE_CPU_MASK"] = mask
    if env.get("ETSERVE_CPU_MASK"):
        if not CPU_MASK.exists():
            raise WorkerError(f"ETSERVE_CPU_MASK needs {CPU_MASK} (make -C native)")
        env["LD_PRELOAD"] = " ".join(filter(None, (str(CPU_MASK), env.get("LD_PRELOAD"))))
    return env


class Worker:
    """A subprocess (bench/runtimes.py) holding one .pte in one runtime: ours (libetserve.so),
    ExecuTorch's kernels through the wheel's pybinding, or ExecuTorch's LLM runner. The
    torch-linked kernels register into the same runtime library as ours, so each runtime
    gets its own process. Loads once (in the background until `info` is read), then
    answers `call`s (JSON lines). cpu_mask ("avx2", "x86-64"): the process sees that smaller CPU
    (masked_env)."""

    def __init__(self, kind: str, model_dir: Path, threads: int, cpu_mask: str | None = None):
        self.kind = kind
        self.log = tempfile.NamedTemporaryFile(prefix=f"etserve-bench-{kind}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.runtimes", kind, str(model_dir), "--threads", str(threads)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env=masked_env(cpu_mask))
        self._info: dict | None = None

    @property
    def info(self) -> dict:
        """What the model says about itself, once loaded; WorkerError if it did not load."""
        if self._info is None:
            self._info = self._reply()
        return self._info

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            tail = Path(self.log.name).read_text(errors="replace").strip().splitlines()[-3:]
            raise WorkerError(f"{self.kind} worker exited ({self.proc.returncode}): " + " | ".join(tail))
        reply = json.loads(line)
        if isinstance(reply, dict) and "error" in reply:
            raise WorkerError(reply["error"])
        return reply

    def call(self, op: str, **args):
        self.info  # noqa: B018 (wait for the model)
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.log.closed:
            return
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # the worker ends at the end of its input
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def spawn(kind: str, directory: Path, threads: int) -> Worker | str:
    """A worker loading in the background, or why it cannot."""
    try:
        return Worker(kind, directory, threads)
    except (WorkerError, OSError) as e:
        return f"{e}"


def ready(worker: Worker | str) -> Worker | str:
    """The worker once its model has loaded, or why it did not."""
    if isinstance(worker, str):
        return worker
    try:
        worker.info  # noqa: B018
        return worker
    except WorkerError as e:
        worker.close()
        return str(e)
