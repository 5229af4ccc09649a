"""The OpenAI-compatible API: a folder per capability (routes, request shapes, serving logic)."""
