"""GET /props: llama.cpp's server properties, the part clients read. llama.vscode takes the
context window from `default_generation_settings.n_ctx` (before any /v1/models field)."""

from __future__ import annotations

import falcon

from app.model_host import ServedModel


class PropsResource:
    def __init__(self, model: ServedModel):
        self.model = model

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        context = self.model.context_length
        resp.media = {
            "default_generation_settings": {
                "n_ctx": context,
                "id_slot": 0,
                "params": {"n_predict": -1, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05},
            },
            "total_slots": len(self.model.engine.slots),
            "model_alias": self.model.id,
            "model_path": self.model.id,
            "n_ctx": context,
            "modalities": {"vision": False, "audio": False},
            "chat_template": self.model.tokenizer.chat_template or "",
            "build_info": "etserve",
        }
