"""Shared fixtures: the test model built by the project, and a real gunicorn serving it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from e2e.servers import Server  # tests/ is on sys.path (pytest inserts a rootdir conftest's folder)


def _test_model_dir() -> Path:
    explicit = os.environ.get("ETSERVE_TEST_MODEL_DIR")
    if explicit:
        return Path(explicit)
    from app.models.registry import model_dir, resolve_options

    return model_dir("smollm2-135m", resolve_options("smollm2-135m", max_seq_len=512, custom_ops=True))


@pytest.fixture(scope="session")
def model_dir() -> Path:
    path = _test_model_dir()
    if not (path / "model.pte").exists():
        pytest.fail(f"test model missing at {path}: run `make test` (it builds it)")
    return path


@pytest.fixture
def broken_model_dir(tmp_path, model_dir) -> Path:
    """A model directory whose tokenizer is fine and whose model.pte is not an ExecuTorch program."""
    broken = tmp_path / "broken-model"
    broken.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir / name, broken / name)
    (broken / "model.pte").write_bytes(b"this is not an ExecuTorch program" * 64)
    return broken


@pytest.fixture(scope="module")
def make_server(model_dir):
    """Start another server with extra ETSERVE_* settings; stopped at the end of the test module
    (each holds a model: kept for the whole session, the servers of every module added up to more
    memory than the machine has)."""
    started = []

    def start(extra_env: dict[str, str], status: str = "ok") -> Server:
        srv = Server(Path(extra_env.pop("ETSERVE_MODEL_PATH", model_dir)), extra_env)
        started.append(srv)
        srv.wait_ready(status=status)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def server(model_dir):
    srv = Server(model_dir)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def _qwen_dir() -> Path:
    explicit = os.environ.get("ETSERVE_TEST_QWEN_DIR")
    if explicit:
        return Path(explicit)
    from app.models.registry import default_model_dir

    return default_model_dir("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def qwen_dir() -> Path:
    """The default served model (Qwen2.5-Coder-0.5B, 8da4w): the one with a tool-calling template."""
    path = _qwen_dir()
    if not (path / "model.pte").exists():
        pytest.fail(f"Qwen model missing at {path}: run `make test` (it builds it)")
    return path


@pytest.fixture(scope="session")
def qwen_server(qwen_dir):
    srv = Server(qwen_dir)
    try:
        srv.wait_ready(timeout=300)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def served_model(model_dir):
    """The same model the server loads, in this process: for driving the engine directly."""
    from app.model_host import load_served_model
    from app.settings import Settings

    settings = Settings.from_env({"ETSERVE_MODEL_PATH": str(model_dir), "ETSERVE_THREADS": "2"})
    return load_served_model(settings)
