"""The WSGI application: routes wired to their resources.

gunicorn loads it with `app.wsgi:create_app()` (see gunicorn.conf.py).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import falcon

from app.auth import RequireApiKey
from app.engine.offload import run_blocking, spawn
from app.health import HealthResource, ModelState, RequireModel
from app.model_host import ServedModel, load_served_model
from app.openai import errors
from app.openai.chat.routes import chat_completions_resource
from app.openai.chat.serving import ChatCompletions
from app.openai.completions.routes import completions_resource
from app.openai.completions.serving import Completions
from app.openai.models.routes import ModelsResource
from app.openai.tokenize.routes import TokenizerResource
from app.openai.tokenize.serving import Tokenization
from app.request_id import RequestId
from app.settings import Settings


def add_model_routes(app: falcon.App, model: ServedModel, settings: Settings) -> None:
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


def build_app(settings: Settings, loader: Callable[[], ServedModel]) -> falcon.App:
    """The app answers at once; /health says "loading" until `loader` (run in the
    background, off the event loop) has produced the model and its routes exist."""
    state = ModelState()
    middleware = [RequestId()]
    if settings.api_key:
        middleware.append(RequireApiKey(settings.api_key))
    middleware.append(RequireModel(state))
    app = falcon.App(middleware=middleware)
    app.req_options.strip_url_path_trailing_slash = True
    errors.install(app)
    app.add_route("/health", HealthResource(state))

    def load() -> None:
        state.load(lambda: run_blocking(loader), lambda model: add_model_routes(app, model, settings))

    spawn(load)
    return app


def create_app(settings: Settings | None = None) -> falcon.App:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings or Settings.from_env()
    return build_app(settings, lambda: load_served_model(settings))

