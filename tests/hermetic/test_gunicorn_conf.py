"""gunicorn.conf.py takes its bind address from app/settings.py, the one table of settings."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from app.settings import Settings

CONF = Path(__file__).resolve().parents[2] / "gunicorn.conf.py"


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
    with pytest.raises(ValueError, match="port must be an integer"):
        bind(monkeypatch, {"ETSERVE_PORT": "eighty"})


def test_the_config_declares_no_setting_of_its_own():
    text = CONF.read_text()
    assert "ETSERVE_HOST" not in text and "ETSERVE_PORT" not in text
