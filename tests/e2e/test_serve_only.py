"""Build here, serve there (issue 16): the project's own platform wheel installed without extras
into a fresh virtualenv where torch (and the rest of the build tooling) cannot be imported; the
test model packed here with `python -m app.models pack`, unpacked by that virtualenv, served by
its `etserve` and answered through the `openai` SDK of the test's own environment. A corrupted
or mismatched model directory is refused at start, naming the file, while the server stays up.

The wheel is rebuilt every run (the native build is incremental: seconds); the virtualenv's
dependencies are installed once per setup.cfg under test-artifacts/serve-only/ (network on the
first run), and the package itself is reinstalled from the fresh wheel each time.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import requests

from app.models.manifest import add_checksums, read_manifest
from e2e.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "serve-only"
# What serving must never need; the virtualenv must not have them, and importing one fails loudly.
FORBIDDEN = ("torch", "torchao", "transformers", "gguf", "executorch", "accelerate")
BLOCKED_MARK = "serve-only test: blocked import of"
# The bound: a tenth of the 2.4 GB development virtualenv (torch, transformers, executorch...).
MAX_INSTALL_BYTES = 240 * 1000 * 1000
BLOCKER = f'''"""Makes {", ".join(FORBIDDEN)} unimportable, and says so on stderr if anything tries."""
import sys


class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {FORBIDDEN!r}:
            sys.stderr.write("{BLOCKED_MARK} " + name + "\\n")
            raise ImportError(name + " is not installed in a serve-only etserve")
        return None


sys.meta_path.insert(0, _Blocked())
'''


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kw)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _box_env(**extra: str) -> dict[str, str]:
    """A clean environment, as on a box: no PYTHONPATH, no ETSERVE_NATIVE_LIB, nothing of the checkout."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    env.update(extra)
    return env


def _install_requires() -> str:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg["options"]["install_requires"]


def _disk_usage(path: Path) -> int:
    seen, total = set(), 0
    for p in path.rglob("*"):
        st = p.lstat()
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


@pytest.fixture(scope="module")
def wheel() -> Path:
    out = ARTIFACTS / "dist"
    shutil.rmtree(out, ignore_errors=True)
    _run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
         cwd=ROOT)
    (path,) = out.glob("etserve-*.whl")
    return path


@pytest.fixture(scope="module")
def serve_venv(wheel) -> Path:
    """A virtualenv holding etserve's wheel and its dependencies, no extras."""
    key = hashlib.sha256(f"{sys.version}\n{_install_requires()}".encode()).hexdigest()[:12]
    venv = ARTIFACTS / f"venv-{key}"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if not (venv / ".ready").exists():
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(venv)])
        _run(pip + [str(wheel)], env=env)
        (venv / ".ready").touch()
    else:  # the dependencies are those of this setup.cfg already: only etserve itself is new
        _run(pip + ["--no-deps", "--force-reinstall", str(wheel)], env=env)
    purelib = _run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   env=_box_env()).stdout.strip()
    (Path(purelib) / "_etserve_test_block.py").write_text(BLOCKER)
    (Path(purelib) / "_etserve_test_block.pth").write_text("import _etserve_test_block\n")
    return venv


@pytest.fixture(scope="module")
def box(tmp_path_factory) -> Path:
    """A working directory away from the checkout: `import app` cannot find the source tree there."""
    return tmp_path_factory.mktemp("box")


@pytest.fixture(scope="module")
def unpacked_model(serve_venv, model_dir, box):
    """The test model, packed by the build side, unpacked by the serve-only side."""
    archives = ARTIFACTS / "pack"
    shutil.rmtree(archives, ignore_errors=True)
    out = _run([sys.executable, "-m", "app.models", "pack", "smollm2-135m", "--out", str(model_dir),
                "--dest", str(archives)], cwd=ROOT)
    archive = Path(out.stdout.splitlines()[0])
    assert (archive.parent / (archive.name + ".sha256")).is_file()
    target = box / "models" / "smollm2"
    try:
        out = _run([str(serve_venv / "bin" / "python"), "-m", "app.models", "unpack", str(archive),
                    "--out", str(target)], cwd=box, env=_box_env())
        assert out.stdout.strip() == str(target)
        assert BLOCKED_MARK not in out.stderr, out.stderr
        yield target
    finally:  # two copies of the weights: do not leave them in pytest's kept temp dirs
        shutil.rmtree(archives, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)


class BoxServer:
    """`etserve` of the serve-only virtualenv, started from the box directory."""

    def __init__(self, venv: Path, box: Path, model: Path):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = ARTIFACTS / f"server-{self.port}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(venv / "bin" / "etserve"), "--model-path", str(model), "--port", str(self.port), "--threads", "2"],
            cwd=box, env=_box_env(), stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, status: str, timeout: float = 120) -> requests.Response:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"etserve exited with {self.proc.returncode}:\n{self.log()[-4000:]}"
            try:
                r = requests.get(self.base_url + "/health", timeout=2)
                if r.json().get("status") == status:
                    return r
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise AssertionError(f"no /health {status!r} in {timeout}s:\n{self.log()[-4000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def test_the_install_holds_no_torch_and_is_small(serve_venv, box):
    names = {d["name"].lower() for d in json.loads(_run(
        [str(serve_venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"], env=_box_env()).stdout)}
    assert {"etserve", "falcon", "gunicorn", "gevent", "jinja2", "tokenizers", "llguidance"} <= names
    assert not names & set(FORBIDDEN), f"the serve-only install has {sorted(names & set(FORBIDDEN))}"
    torch = subprocess.run([str(serve_venv / "bin" / "python"), "-c", "import torch"], cwd=box, env=_box_env(),
                           capture_output=True, text=True)
    assert torch.returncode != 0 and f"{BLOCKED_MARK} torch" in torch.stderr
    where = _run([str(serve_venv / "bin" / "python"), "-c",
                  "import app.engine.native as n; print(n.library_path())"], cwd=box, env=_box_env()).stdout.strip()
    assert Path(where).is_relative_to(serve_venv) and where.endswith("app/_native/libetserve.so")
    size = _disk_usage(serve_venv)
    print(f"serve-only virtualenv: {size / 1e6:.0f} MB on disk")
    assert size <= MAX_INSTALL_BYTES, f"the serve-only install takes {size / 1e6:.0f} MB"


def test_a_packed_model_is_served_to_the_openai_sdk(serve_venv, box, unpacked_model):
    srv = BoxServer(serve_venv, box, unpacked_model)
    try:
        srv.wait("ok")
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": "Name three colors of the rainbow."}]
        r = client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=16, temperature=0)
        text = r.choices[0].message.content
        assert text.strip() and r.usage.completion_tokens > 0
        stream = client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=16,
                                                temperature=0, stream=True)
        chunks = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert len(chunks) > 2 and "".join(chunks) == text  # greedy: the same text, token by token
        log = srv.log()
        library = serve_venv.resolve() / "lib"
        assert f"native runtime: {library}" in log and "app/_native/libetserve.so" in log, log[-4000:]
        assert f"{unpacked_model} matches its etserve.json (" in log and "sizes and SHA-256" in log
        assert BLOCKED_MARK not in log, log[-4000:]
    finally:
        srv.stop()


def _copy_model(model_dir: Path, to: Path) -> Path:
    """The test model's files, model.pte linked (it is large), the others copied to be changed;
    with checksums even if the model was built before they were recorded."""
    to.mkdir()
    for f in model_dir.iterdir():
        if f.name == "model.pte":
            (to / f.name).symlink_to(f.resolve())
        elif f.is_file():
            shutil.copy(f, to / f.name)
    if not read_manifest(to).get("sha256"):
        add_checksums(to)
    return to


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x20
    path.write_bytes(bytes(data))


def _truncate_pte(path: Path) -> None:
    with open(path.resolve(), "rb") as f:
        head = f.read(1 << 20)
    path.unlink()
    path.write_bytes(head)


def _another_builds_manifest(path: Path) -> None:
    m = json.loads(path.read_text())
    m["max_seq_len"] *= 2  # every file matches, but the manifest describes another export
    path.write_text(json.dumps(m))


@pytest.mark.parametrize("changed, change, named, problem", [
    ("tokenizer.json", _flip_a_byte, "tokenizer.json", "tokenizer.json does not match its SHA-256 in etserve.json"),
    ("model.pte", _truncate_pte, "model.pte", "model.pte has 1048576 bytes where etserve.json says"),
    ("etserve.json", lambda p: p.write_text(p.read_text()[:-20]), "etserve.json", "etserve.json is not valid JSON"),
    ("etserve.json", _another_builds_manifest, "model.pte",
     "model.pte has max_seq_len 512 where etserve.json says 1024"),
], ids=["changed-tokenizer", "truncated-pte", "broken-manifest", "mismatched-manifest"])
def test_a_corrupted_or_mismatched_model_is_refused_at_start(serve_venv, box, model_dir, tmp_path, changed, change,
                                                             named, problem):
    directory = _copy_model(model_dir, tmp_path / "model")
    change(directory / changed)
    srv = BoxServer(serve_venv, box, directory)
    try:
        health = srv.wait("failed", timeout=60)
        assert health.status_code == 503
        assert health.json()["error"].startswith(f"model directory refused: {problem}"), health.json()
        assert str(tmp_path) not in health.text  # the open route names the file, not where it lives
        r = requests.post(srv.base_url + "/v1/chat/completions", timeout=10,
                          json={"messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_failed"
        assert srv.proc.poll() is None, "the server died"
        failed = [line for line in srv.log().splitlines() if "model failed to load:" in line]
        assert len(failed) == 1 and f"{directory / named}: " in failed[0], srv.log()[-4000:]
        assert "Traceback" not in srv.log()
    finally:
        srv.stop()
