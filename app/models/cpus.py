"""How many cores a build step may use: the ones this process may run on, at most the
step's setting (an environment variable; 2 by default, the machines this is built on)."""

from __future__ import annotations

import os


def usable_cpus(setting: str, default: int = 2) -> int:
    """min(the cores this process may run on, int($setting or default)), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # platforms without affinity
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, int(os.environ.get(setting, str(default)))))
