"""Runs a blocking native call without stalling the gevent hub.

Under gunicorn's gevent worker the call goes to gevent's native thread pool, so
the hub keeps serving other sockets (and gunicorn's heartbeat) while a token is
computed; ctypes releases the GIL for the duration of the C call. Outside
gevent (tests, scripts) the call simply runs in the caller's thread.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def gevent_active() -> bool:
    """True inside gunicorn's gevent worker (threading is monkey-patched)."""
    if "gevent" not in sys.modules:
        return False
    from gevent import monkey

    return monkey.is_module_patched("threading")


def run_blocking(fn: Callable[..., T], *args) -> T:
    if gevent_active():
        import gevent

        def call():  # hand an exception back: raised in the pool, gevent would print it as unhandled
            try:
                return True, fn(*args)
            except Exception as e:
                return False, e

        ok, value = gevent.get_hub().threadpool.apply(call)
        if not ok:
            raise value
        return value
    return fn(*args)


def spawn(fn: Callable[[], None]) -> None:
    """Run `fn` beside the server: a greenlet under gevent, else a daemon thread."""
    if gevent_active():
        import gevent

        gevent.spawn(fn)
    else:
        threading.Thread(target=fn, daemon=True).start()
