"""Runs a blocking native call without stalling the gevent hub.

Under gunicorn's gevent worker the call goes to gevent's native thread pool, so
the hub keeps serving other sockets (and gunicorn's heartbeat) while a token is
computed; ctypes releases the GIL for the duration of the C call. Outside
gevent (tests, scripts) the call simply runs in the caller's thread.
"""

from __future__ import annotations

import sys
from typing import Callable, TypeVar

T = TypeVar("T")


def _gevent_active() -> bool:
    if "gevent" not in sys.modules:
        return False
    from gevent import monkey

    return monkey.is_module_patched("threading")


def run_blocking(fn: Callable[..., T], *args) -> T:
    if _gevent_active():
        import gevent

        return gevent.get_hub().threadpool.apply(fn, args)
    return fn(*args)
