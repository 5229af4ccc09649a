"""The OpenAI Responses API (POST /v1/responses) on the shared chat pipeline."""
