"""How much KV memory the sequence slots keep once their requests end.

Each slot can hold a whole context, and memory is used as its positions are written
(kv_slots.h), so a finished request's slot is a prefix-cache entry that costs what it holds.
Unchecked, four slots that each served a long prompt hold four contexts' worth: a 32k Qwen
build's idle server held 0.8 GB of stale caches where llama.cpp, whose slots share one
context's worth of cache (its unified KV), holds 0.4 GB.

So after a request ends its slot gives back what lies past what it holds (a shorter prompt
over a longer old one, rejected draft rows), and the caches of all slots together keep at most
`budget` bytes: beyond it the idle slots are cut from their ends, anonymous ones before a
session's, least recently used first. A request in flight always keeps its whole context (it
is never cut and never refused for memory), so the budget bounds what idle slots cache, not
what requests use. The default budget is one context's worth of caches: what llama.cpp's
unified cache holds.

`plan` is the pure policy (tests/engine/test_kv_budget.py); the Engine applies it under the
step gate, where no forward call runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .slots import Slot


@dataclass(frozen=True)
class Trim:
    slot: int  # its index
    keep: int  # positions it keeps (its tokens[:keep])


def plan(slots: Iterable[Slot], resident: dict[int, int], budget: int, bytes_per_position: int) -> list[Trim]:
    """The cuts that bring the slots' resident cache bytes (`resident`, by slot index) within
    `budget`: idle slots only, anonymous before owned, least recently used first, each cut as
    little as needed (from its end, so its prompt's start stays cached). Empty when within."""
    total = sum(resident.values())
    if total <= budget or bytes_per_position <= 0:
        return []
    out = []
    idle = [s for s in slots if not s.busy and resident.get(s.index, 0) > 0]
    for s in sorted(idle, key=lambda s: (s.owner is not None, s.last_used)):
        excess = total - budget
        if excess <= 0:
            break
        held = resident[s.index]
        keep = min(len(s.tokens), max(0, held - excess) // bytes_per_position)
        # the runtime gives back whole 64-position blocks past `keep`: round down so the cut frees
        # what it is counted for
        keep = keep // 64 * 64
        out.append(Trim(s.index, keep))
        total -= max(0, held - keep * bytes_per_position)
    return out
