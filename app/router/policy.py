"""Which loaded models give way to another: the least recently used idle ones, as few as fit it.

Pure logic (no I/O): the router (app/router/hosting.py) asks it before each load."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Loaded:
    """A model in memory (or on its way): what it counts against the caps, and whether it may go."""

    name: str
    size: int  # bytes counted against the memory cap (its .pte file)
    busy: int  # requests in flight (a loading model counts as busy: it cannot be unloaded)
    last_used: float  # monotonic seconds of its last request


class WontFit(Exception):
    """The model alone is larger than the memory cap: no unloading makes room for it."""


def evictions(loaded: list[Loaded], size: int, max_models: int, max_bytes: int = 0) -> list[str] | None:
    """The names to unload, least recently used first, so that one more model of `size` bytes fits
    in `max_models` models and `max_bytes` (0: no memory cap); [] when it fits already; None while
    fitting it would take a busy model (the caller waits for one to finish). WontFit if `size`
    alone is over `max_bytes`."""
    if max_models < 1:
        raise ValueError(f"max_models must be 1 or more, got {max_models}")
    if max_bytes and size > max_bytes:
        raise WontFit(f"{size} bytes is over the cap of {max_bytes}")
    count, used = len(loaded), sum(m.size for m in loaded)

    def fits() -> bool:
        return count + 1 <= max_models and (not max_bytes or used + size <= max_bytes)

    out: list[str] = []
    for m in sorted((m for m in loaded if m.busy == 0), key=lambda m: m.last_used):
        if fits():
            break
        out.append(m.name)
        count, used = count - 1, used - m.size
    return out if fits() else None
