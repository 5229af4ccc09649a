"""The gunicorn config (app/gunicorn_conf.py, which the checkout's gunicorn.conf.py imports) takes
its bind address from app/settings.py, the one table of settings."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "app" / "gunicorn_conf.py"


def bind(monkeypatch, env: dict[str, str]) -> list[str]:
    for name in ("ETSERVE_HOST", "ETSERVE_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(CONF))["bind"]


def test_bind_follows_the_settings(monkeypatch):
    defaults = Settings.from_env({})
    assert bind(monkeypatch, {}) == [f"{defaults.host}:{defaults.port}"]
    assert bind(monkeypatch, {"ETSERVE_HOST": "0.0.0.0", "ETSERVE_PORT": "9001"}) == ["0.0.0.0:9001"]
    assert bind(monkeypatch, {"ETSERVE_HOST": "::1", "ETSERVE_PORT": "9002"}) == ["[::1]:9002"]


def test_a_bad_setting_fails_when_gunicorn_reads_its_config(monkeypatch):
    with pytest.raises(SystemExit, match="port must be an integer"):
        bind(monkeypatch, {"ETSERVE_PORT": "eighty"})


def test_the_config_declares_no_setting_of_its_own():
    for conf in (CONF, ROOT / "gunicorn.conf.py"):
        text = conf.read_text()
        assert "ETSERVE_HOST" not in text and "ETSERVE_PORT" not in text
    assert "from app.gunicorn_conf import *" in (ROOT / "gunicorn.conf.py").read_text()
