"""GET /health, and the model's life cycle it reports: loading, ok, failed.

/health never waits on the engine lock; while the model is not ready every
other route answers 503 with the same state.
"""

from __future__ import annotations

import logging
import re
from typing import Callable

import falcon

from app.engine import NativeError
from app.http.errors import APIError
from app.model_host import ServedModel
from app.models.manifest import ManifestError

log = logging.getLogger("etserve")


_PATH = re.compile(r"(?:/[^/\s:'\"]+)+/([^/\s:'\"]+)")


def _without_paths(message: str) -> str:
    """A load error as a client may read it: each absolute path cut to its file's name."""
    return _PATH.sub(r"\1", message)[:300]


class ModelState:
    """Where the one served model is in its life: "loading", "ok" or "failed"."""

    def __init__(self) -> None:
        self.status = "loading"
        self.model: ServedModel | None = None
        self.error: str | None = None
        self.public_error: str | None = None  # what /health may say: file names, never paths
        self.metrics = None  # the model app's app.metrics.Metrics (a router's /metrics gathers them)

    def load(self, loader: Callable[[], ServedModel], on_ready: Callable[[ServedModel], None]) -> None:
        try:
            model = loader()
            on_ready(model)
        except (NativeError, OSError, ManifestError, ValueError) as e:
            # expected: a bad or missing file, a setting the model cannot take; the message says it all
            log.error("model failed to load: %s", e)
            log.debug("model failed to load", exc_info=True)
            self.status, self.error = "failed", str(e)
            self.public_error = e.public if isinstance(e, ManifestError) else _without_paths(str(e))
            return
        except Exception as e:  # the worker stays up and says why on /health
            log.exception("model failed to load")
            self.status, self.error = "failed", str(e)
            return
        self.model, self.status = model, "ok"


class RequireModel:
    """Falcon middleware: until the model is ready, every route but /health (and `open_paths`,
    which need no model) is a 503."""

    def __init__(self, state: ModelState, open_paths: frozenset[str] = frozenset()):
        self.state = state
        self.open_paths = open_paths | {"/health"}

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if self.state.status != "ok" and req.path not in self.open_paths:
            message = "the model is still loading" if self.state.status == "loading" else "the model failed to load"
            raise APIError(503, message, code=f"model_{self.state.status}", headers={"Retry-After": "5"})


class HealthResource:
    def __init__(self, state: ModelState):
        self.state = state

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        state = self.state
        body: dict = {"status": state.status}
        if state.model is not None:
            engine = state.model.engine
            body["model"] = state.model.id
            body["engine"] = {
                "generating": engine.generating,
                "waiting": engine.waiting,
                "requests": engine.requests_started,
                "forward_calls": engine.forward_calls,
                # the prompt being read right now (llama.cpp's shape), null between prefills
                "prompt_progress": progress.as_dict() if (progress := engine.prompt_progress) else None,
                # sequence slots (GET /slots has each one's state)
                "slots": {"total": len(engine.slots), "busy": sum(1 for s in engine.slots if s.busy),
                          "memory": engine.slot_memory()},
            }
            disk = engine.sessions.disk
            if disk is not None:
                body["engine"]["session_dir"] = {"files": len(disk), "bytes": disk.used_bytes,
                                                 "ignored": disk.ignored}
        if state.error:  # the cause (with file paths) is in the server log, not on an open route
            body["error"] = state.public_error or "the model failed to load; the server log says why"
        resp.status = falcon.HTTP_200 if state.status == "ok" else falcon.HTTP_503
        resp.media = body

