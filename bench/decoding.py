"""The decode loop a worker runs over a bare runtime (no server): prefill to a fill, then time
decode steps; and which fills fit a context."""

from __future__ import annotations

import time
from typing import Callable, Sequence


def fills_within(max_seq_len: int, fills: Sequence[int], steps: int) -> list[int]:
    """The fills whose decode steps fit the context; a fill that does not fit is replaced
    by the largest one that does (once)."""
    largest = max_seq_len - steps - 1
    fit = [f for f in fills if f <= largest]
    if len(fit) < len(fills) and (not fit or fit[-1] < largest):
        fit.append(largest)
    return fit


def decode_fills(forward: Callable[[Sequence[int], int], None], choose: Callable[[], int],
                 ids: Sequence[int], fills: Sequence[int], steps: int, chunk: int) -> list[dict]:
    """For each fill in turn: prefill `ids` up to it in chunks (only what no earlier fill
    prefilled: the cache is filled once, to the largest fill so far), pick the first token
    (untimed, as a server's time to first token), then time `steps` decode steps (forward one
    token + pick the next). Fills may repeat in any order (128, 1500, 1500, 128) to alternate
    measurements; a decode overwrites positions after its fill, which stay filled all the same."""
    results, filled = [], 0
    for fill in fills:
        t0 = time.perf_counter()
        for start in range(filled, fill, chunk):
            forward(ids[start:min(start + chunk, fill)], start)
        prefill_s = time.perf_counter() - t0
        prefilled, filled = max(0, fill - filled), max(filled, fill)
        token = choose()
        t0, c0 = time.perf_counter(), time.process_time()
        for k in range(steps):
            forward([token], fill + k)
            token = choose()
        cpu = time.process_time() - c0
        results.append({"fill": fill, "decode_tok_s": steps / (time.perf_counter() - t0),
                        "prefill_tok_s": prefilled / prefill_s if prefilled else None,
                        # steps per CPU second of the whole process (every runtime thread): what a
                        # busy shared host's time slicing does not stretch
                        "decode_tok_cpu_s": steps / cpu if cpu > 0 else None})
    return results
