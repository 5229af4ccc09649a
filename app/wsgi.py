"""The WSGI application: routes wired to their resources.

gunicorn loads it with `app.wsgi:create_app()` (see gunicorn.conf.py).
"""

from __future__ import annotations

import logging
import time

import falcon

from app.health import HealthResource
from app.model_host import ServedModel, load_served_model
from app.openai import errors
from app.openai.chat.routes import chat_completions_resource
from app.openai.chat.serving import ChatCompletions
from app.openai.completions.routes import completions_resource
from app.openai.completions.serving import Completions
from app.openai.models.routes import ModelsResource
from app.openai.tokenize.routes import TokenizerResource
from app.openai.tokenize.serving import Tokenization
from app.settings import Settings


def build_app(model: ServedModel, settings: Settings) -> falcon.App:
    app = falcon.App()
    app.req_options.strip_url_path_trailing_slash = True
    errors.install(app)
    chat_service = ChatCompletions(model)
    chat = chat_completions_resource(chat_service, settings.max_body_bytes)
    completions = completions_resource(Completions(model), settings.max_body_bytes)
    tokenizer = TokenizerResource(Tokenization(model, chat_service), settings.max_body_bytes)
    models = ModelsResource(model, int(time.time()))
    for prefix in ("/v1", ""):
        app.add_route(f"{prefix}/chat/completions", chat)
        app.add_route(f"{prefix}/completions", completions)
        for name in ("tokenize", "detokenize", "apply-template"):
            app.add_route(f"{prefix}/{name}", tokenizer, suffix=name.replace("-", "_"))
        app.add_route(f"{prefix}/models", models)
        app.add_route(f"{prefix}/models/{{model_id}}", models, suffix="one")
    app.add_route("/health", HealthResource(model))
    return app


def create_app(settings: Settings | None = None) -> falcon.App:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings or Settings.from_env()
    return build_app(load_served_model(settings), settings)
