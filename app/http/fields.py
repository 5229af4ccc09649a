"""Typed reads of request fields; each failure is a 400 that names the field."""

from __future__ import annotations

import math
from typing import Any

from .errors import APIError, invalid_value

_MISSING = object()


class Fields:
    """Reads fields out of one JSON object and remembers which it has read."""

    def __init__(self, body: dict[str, Any]):
        self.body = body
        self.seen: set[str] = set()

    @classmethod
    def of(cls, body: Any) -> "Fields":
        """Fields of a request body, which must be a JSON object."""
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object", code="invalid_request")
        return cls(body)

    def raw(self, name: str) -> Any:
        self.seen.add(name)
        value = self.body.get(name, _MISSING)
        return None if value is _MISSING else value

    def number(self, name: str, default: float | None, *, lo: float | None = None, hi: float | None = None,
               lo_open: bool = False) -> float | None:
        value = self.raw(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise invalid_value(name, f"'{name}' must be a number")
        try:
            value = float(value)  # an integer of 400 digits is past the float range too
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise invalid_value(name, f"'{name}' is out of range")
        if lo is not None and (value < lo or (lo_open and value == lo)):
            bound = f"greater than {lo}" if lo_open else f"at least {lo}"
            raise invalid_value(name, f"'{name}' must be {bound}, got {value}")
        if hi is not None and value > hi:
            raise invalid_value(name, f"'{name}' must be at most {hi}, got {value}")
        return float(value)

    def integer(self, name: str, default: int | None, *, lo: int | None = None, hi: int | None = None) -> int | None:
        value = self.raw(name)
        if value is None:
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid_value(name, f"'{name}' must be an integer")
        if lo is not None and value < lo:
            raise invalid_value(name, f"'{name}' must be at least {lo}, got {value}")
        if hi is not None and value > hi:
            raise invalid_value(name, f"'{name}' must be at most {hi}, got {value}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.raw(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise invalid_value(name, f"'{name}' must be a boolean")
        return value

    def string(self, name: str, default: str | None) -> str | None:
        value = self.raw(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise invalid_value(name, f"'{name}' must be a string")
        return value

    def obj(self, name: str) -> dict[str, Any] | None:
        value = self.raw(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise invalid_value(name, f"'{name}' must be an object")
        return value

    def array(self, name: str) -> list[Any] | None:
        value = self.raw(name)
        if value is None:
            return None
        if not isinstance(value, list):
            raise invalid_value(name, f"'{name}' must be an array")
        return value

    def reject_unknown(self) -> None:
        """A 400 naming the first field nothing has read: unknown fields are refused, not ignored."""
        unknown = sorted(set(self.body) - self.seen)
        if unknown:
            raise invalid_value(unknown[0], f"unknown parameter '{unknown[0]}'")


def message_list(value: Any, limit: int, param: str = "messages") -> list[Any]:
    """A required, non-empty array of at most `limit` entries (a conversation's messages)."""
    if value is None:
        raise APIError(400, f"'{param}' is required", code="missing_required_parameter", param=param)
    if not isinstance(value, list) or not value:
        raise invalid_value(param, f"'{param}' must be a non-empty array")
    if len(value) > limit:
        raise invalid_value(param, f"'{param}' holds at most {limit} entries")
    return value

