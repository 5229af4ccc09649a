"""spec/openapi.yaml is a valid OpenAPI 3.1 document and names every route the app serves."""

from __future__ import annotations

from pathlib import Path

import yaml
from openapi_spec_validator import validate

SPEC = Path(__file__).resolve().parents[1] / "spec" / "openapi.yaml"


def test_spec_is_valid_openapi():
    validate(yaml.safe_load(SPEC.read_text()))


def test_spec_documents_every_route():
    paths = set(yaml.safe_load(SPEC.read_text())["paths"])
    for route in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/{model_id}",
                  "/v1/tokenize", "/v1/detokenize", "/v1/apply-template", "/health",
                  "/v1/sessions", "/v1/sessions/{session_id}", "/metrics", "/",
                  "/v1/responses", "/v1/responses/{response_id}", "/v1/messages", "/v1/messages/count_tokens",
                  "/infill", "/slots", "/completion", "/props", "/models/load", "/models/unload"):
        assert route in paths, route
