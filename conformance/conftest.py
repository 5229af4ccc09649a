"""Black-box OpenAI conformance: run against any base URL.

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_MODEL=... pytest conformance

Nothing here imports the server; every test talks HTTP. Without OPENAI_BASE_URL,
or when nothing answers there, the whole suite is skipped.
"""

from __future__ import annotations

import os

import pytest
import requests


@pytest.fixture(scope="session")
def base_url() -> str:
    url = os.environ.get("OPENAI_BASE_URL", "").rstrip("/")
    if not url:
        pytest.skip("OPENAI_BASE_URL is not set")
    try:
        requests.get(url + "/models", timeout=5, headers=auth_headers())
    except requests.RequestException as e:
        pytest.skip(f"nothing answers at {url}: {e}")
    return url


def auth_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', 'unused')}"}


@pytest.fixture(scope="session")
def model(base_url) -> str:
    name = os.environ.get("OPENAI_MODEL")
    if name:
        return name
    return requests.get(base_url + "/models", timeout=10, headers=auth_headers()).json()["data"][0]["id"]


@pytest.fixture(scope="session")
def client(base_url):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused"),
                         max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def post(base_url):
    def _post(path: str, body, **kw) -> requests.Response:
        return requests.post(base_url + path, json=body, timeout=300, headers=auth_headers(), **kw)
    return _post
