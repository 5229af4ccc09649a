"""POST /models/load and /models/unload on a single-model server: llama.cpp's router routes
(app/router serves them for real with --models-dir). Here the one model is always loaded: loading
it succeeds at once, any other name is a 404, and unloading is refused with the reason."""

from __future__ import annotations

import falcon

from app.http.body import read_model_name
from app.http.errors import APIError, model_not_found
from app.model_host import ServedModel


class ModelLoadingResource:
    def __init__(self, model: ServedModel, max_body_bytes: int):
        self.model = model
        self.max_body_bytes = max_body_bytes

    def _named(self, req: falcon.Request) -> str:
        name = read_model_name(req, self.max_body_bytes)
        if name != self.model.id:
            raise model_not_found(name, f"this server serves '{self.model.id}'")
        return name

    def on_post_load(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"success": True, "model": self._named(req), "status": "loaded"}

    def on_post_unload(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._named(req)
        raise APIError(400, "this server serves one model, always loaded; start it with --models-dir "
                       "to load and unload models (docs/models.md)", code="unload_unsupported")
