"""GET /health: never waits on the engine lock."""

from __future__ import annotations

import falcon

from app.model_host import ServedModel


class HealthResource:
    def __init__(self, model: ServedModel):
        self.model = model

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        engine = self.model.engine
        resp.media = {
            "status": "ok",
            "model": self.model.id,
            "engine": {
                "generating": engine.generating,
                "waiting": engine.waiting,
                "requests": engine.requests_started,
                "forward_calls": engine.forward_calls,
            },
        }
