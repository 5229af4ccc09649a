"""Reporting: rows of ratios with their targets, printed as one markdown table; progress lines
on stderr."""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from typing import Sequence

NOT_BUILT = "not built"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


@dataclass
class Row:
    """One measured ratio. `name` says what is measured (short, stable: rows are compared across
    runs by it); `what` says how, on what."""

    name: str
    what: str
    measured: str
    ratio: float | None = None
    target: tuple[str, float] | None = None  # (">=" or "<=", value) on `checked`
    checked: float | None = None  # what the target is about: the ratio unless set
    unit: str = ""  # of the target when it is not about the ratio (e.g. "ms")

    @property
    def met(self) -> bool | None:
        value = self.ratio if self.checked is None else self.checked
        if not self.target or value is None:
            return None
        op, bound = self.target
        return value >= bound if op == ">=" else value <= bound

    def cells(self) -> list[str]:
        met = {None: "", True: "yes", False: "**no**"}[self.met]
        target = ""
        if self.target:
            target = f"{self.target[0].replace('>=', '≥').replace('<=', '≤')} {self.target[1]:g}"
            if self.unit:
                target = f"{target} {self.unit}"
        ratio = "" if self.ratio is None else f"{self.ratio:.3g}"
        return [self.name, self.what, self.measured, ratio, target, met]


def markdown(rows: list[Row]) -> str:
    lines = ["| row | what | measured | ratio | target | met |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r.cells()) + " |" for r in rows]
    return "\n".join(lines)
