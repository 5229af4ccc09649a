"""Client input as data, whatever API it arrives on: JSON parsed with bounded depth and size,
numbers that are finite, values of the type the code after it expects.

Every route's request body goes through `loads` (app/http/body.py), and so does every string
the server parses as JSON on a client's behalf: tool-call `arguments` in chat and Responses
history, Anthropic's `metadata.user_id`, the arguments a model writes. A failure is an
`InvalidInput` (a ValueError), which each API turns into a 400 in its own envelope
(app/http/errors.to_api_error; the Messages routes take Anthropic's by path).

This module imports nothing of the APIs, so app/openai, app/anthropic and app/llamacpp all use
it without importing each other.
"""

from __future__ import annotations

import json
import math
from typing import Any

# Deeper than any real request, tool schema or tool arguments, shallow enough that nothing
# recursive after the parse (Jinja's tojson, the grammar compiler, deepcopy) comes near
# Python's recursion limit.
MAX_DEPTH = 64
# A JSON string inside a request: tool-call arguments, a user id. The body's own limit
# (--max-body-bytes) bounds it as well; this bounds each one on its own.
MAX_EMBEDDED_CHARS = 1 << 20


class InvalidInput(ValueError):
    """Input a client sent that the server refuses: a 400 naming `param`."""

    def __init__(self, param: str | None, message: str, code: str = "invalid_value"):
        super().__init__(message)
        self.param = param
        self.message = message
        self.code = code


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses as inf: a number no field can hold
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


# For text that holds JSON among other things (a model's tool call): raw_decode with the rules of
# `loads` (ValueError for a NaN/Infinity literal or a number past the float range).
STRICT_DECODER = json.JSONDecoder(parse_constant=_no_constants, parse_float=_finite_float)


def depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of decoded JSON (a scalar is 1), counted without recursion and stopping
    once past `limit`."""
    level, n = [value], 0
    while level:
        n += 1
        if n > limit:
            return n
        nxt: list[Any] = []
        for v in level:
            if isinstance(v, dict):
                nxt.extend(v.values())
            elif isinstance(v, list):
                nxt.extend(v)
        level = nxt
    return n


def loads(text: str | bytes, *, param: str | None = None, what: str = "the value",
          max_depth: int = MAX_DEPTH, max_chars: int | None = None) -> Any:
    """`text` parsed as strict JSON: no NaN/Infinity literals, no number past the float range,
    at most `max_depth` levels, at most `max_chars` characters; else InvalidInput naming `param`.

    A nesting too deep for the parser itself (thousands of brackets) is the same 400 as one
    past `max_depth`, never a RecursionError."""
    if max_chars is not None and len(text) > max_chars:
        raise InvalidInput(param, f"{what} is {len(text)} characters long; the limit is {max_chars}")
    try:
        value = json.loads(text, parse_constant=_no_constants, parse_float=_finite_float)
    except RecursionError:
        raise InvalidInput(param, f"{what} nests deeper than {max_depth} levels") from None
    except ValueError as e:  # JSONDecodeError, a constant, an out-of-range number, an int of 4300+ digits
        raise InvalidInput(param, f"{what} is not valid JSON: {_short(e)}") from None
    if depth(value, max_depth) > max_depth:
        raise InvalidInput(param, f"{what} nests deeper than {max_depth} levels")
    return value


def loads_embedded(text: str, *, param: str, what: str) -> Any:
    """A JSON document a client sent inside a string field (tool-call arguments and the like)."""
    return loads(text, param=param, what=what, max_chars=MAX_EMBEDDED_CHARS)


def try_loads(text: str, *, max_depth: int = MAX_DEPTH) -> tuple[bool, Any]:
    """(True, value), or (False, None) for anything `loads` refuses: for text that is JSON
    only maybe (a model's output, a user id that may be a plain string)."""
    try:
        return True, loads(text, max_depth=max_depth, max_chars=MAX_EMBEDDED_CHARS)
    except InvalidInput:
        return False, None


def _short(e: Exception) -> str:
    text = str(e)
    return text if len(text) <= 200 else text[:200] + "…"


def check_finite(value: Any, param: str) -> None:
    """A decoded JSON value holds no infinite or NaN float anywhere (values built in Python,
    not parsed by `loads`, can)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise InvalidInput(param, f"'{param}' holds a number out of range")
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def require_str(value: Any, param: str, *, optional: bool = True) -> str | None:
    """`value` if it is a string (or None when `optional`); else a 400 naming `param`."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidInput(param, f"'{param}' must be a string")
    return value


def require_obj(value: Any, param: str, *, optional: bool = True) -> dict[str, Any] | None:
    """`value` if it is a JSON object (or None when `optional`); else a 400 naming `param`."""
    if value is None and optional:
        return None
    if not isinstance(value, dict):
        raise InvalidInput(param, f"'{param}' must be an object")
    return value
