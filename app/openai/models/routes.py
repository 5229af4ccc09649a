"""GET /v1/models and /v1/models/{id}."""

from __future__ import annotations

import falcon

from app.model_host import ServedModel

from ..errors import APIError


def model_card(model: ServedModel, created: int) -> dict:
    return {
        "id": model.id,
        "object": "model",
        "created": created,
        "owned_by": "etserve",
        "context_length": model.context_length,
    }


class ModelsResource:
    def __init__(self, model: ServedModel, created: int):
        self.model = model
        self.created = created

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"object": "list", "data": [model_card(self.model, self.created)]}

    def on_get_one(self, req: falcon.Request, resp: falcon.Response, model_id: str) -> None:
        if model_id != self.model.id:
            raise APIError(404, f"the model '{model_id}' does not exist", code="model_not_found", param="model")
        resp.media = model_card(self.model, self.created)
