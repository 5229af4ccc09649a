"""Hermetic HTTP tests: the real app (build_app) over fakes.scripted.FakeModel, no .pte, no gunicorn."""

from __future__ import annotations

import pytest

from fakes.scripted import FakeModel


@pytest.fixture
def fake():
    model = FakeModel()
    yield model
    model.runtime.release()
    model.close()


@pytest.fixture
def client(fake):
    return fake.client()
