"""Property-based API testing: schemathesis generates requests from spec/openapi.yaml and sends
them to a real server; every response must be what the spec says (schema, status code, content
type) and never a server error.

The server caps generation at a few tokens (ETSERVE_MAX_TOKENS_CAP), so the many generated
completion requests stay cheap whatever max_tokens they ask for.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

SPEC = Path(__file__).resolve().parents[2] / "spec" / "openapi.yaml"
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance]
EXAMPLES_PER_OPERATION = 80
MIN_CASES = 500
CAP = 3
CASES: Counter[str] = Counter()


@pytest.fixture(scope="module")
def st_server(make_server):
    return make_server({"ETSERVE_MAX_TOKENS_CAP": str(CAP), "ETSERVE_MAX_QUEUE": "64"})


schema = schemathesis.openapi.from_path(SPEC)  # each case is sent to st_server's base URL


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_server_conforms_to_its_spec(case, st_server):
    response = case.call(base_url=st_server.base_url, timeout=120)
    CASES[case.operation.label] += 1
    case.validate_response(response, checks=CHECKS)


def test_enough_cases_ran():
    total = sum(CASES.values())
    print(f"\nschemathesis: {total} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(CASES.items())))
    assert total >= MIN_CASES, CASES


def test_max_tokens_cap_ends_choices_with_length(st_server):
    for path, body in (("/v1/completions", {"prompt": "One, two, three,"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Count to fifty."}]})):
        r = requests.post(st_server.base_url + path, json={**body, "max_tokens": 50, "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == CAP
        assert r.json()["choices"][0]["finish_reason"] == "length"
