"""`stream` and `stream_options`, as OpenAI's chat and completions routes read them."""

from __future__ import annotations

from app.http.errors import invalid_value
from app.http.fields import Fields


def parse_stream(f: Fields) -> tuple[bool, bool]:
    """`stream` and `stream_options.include_usage`, as every completion route reads them."""
    stream = f.boolean("stream", False)
    options = f.obj("stream_options") or {}
    if options and not stream:
        raise invalid_value("stream_options", "'stream_options' is only allowed with stream: true")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise invalid_value("stream_options.include_usage", "'include_usage' must be a boolean")
    return stream, include_usage
