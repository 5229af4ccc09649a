"""GET /v1/models and /v1/models/{id}."""

from __future__ import annotations

import time

import falcon

from app.http.errors import model_not_found
from app.model_host import ServedModel


def model_card(model: ServedModel, created: int) -> dict:
    """The model, with its context window under each name clients read it by: `context_length`
    (OpenRouter, LiteLLM), `max_model_len` (vLLM's: Continue's vLLM provider), `context_window`,
    `max_context_length` (LM Studio's), `max_input_tokens` (Anthropic's models API) and llama.cpp's
    `meta.n_ctx`; plus the fields Anthropic's SDK reads (`type`, `display_name`, `created_at`)."""
    context = model.context_length
    return {
        "id": model.id,
        "object": "model",
        "created": created,
        "owned_by": "etserve",
        "context_length": context,
        "max_model_len": context,
        "context_window": context,
        "max_context_length": context,
        "max_input_tokens": context,
        "max_tokens": model.max_tokens_cap or context,
        "meta": {"n_ctx": context, "n_ctx_train": context, "n_vocab": model.tokenizer.vocab_size},
        "type": "model",
        "display_name": model.id,
        "lifecycle": "active",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
    }


class ModelsResource:
    def __init__(self, model: ServedModel, created: int):
        self.model = model
        self.created = created

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        card = model_card(self.model, self.created)
        # OpenAI's list, with the paging fields of Anthropic's (its SDK's models.list reads them)
        resp.media = {"object": "list", "data": [card], "has_more": False, "first_id": card["id"],
                      "last_id": card["id"]}

    def on_get_one(self, req: falcon.Request, resp: falcon.Response, model_id: str) -> None:
        if model_id != self.model.id:
            raise model_not_found(model_id, f"this server serves '{self.model.id}'")
        resp.media = model_card(self.model, self.created)
