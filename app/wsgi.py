"""The WSGI application: routes wired to their resources.

gunicorn loads it with `app.wsgi:create_app()` (see gunicorn.conf.py).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import falcon

from app.anthropic import routes as anthropic_routes
from app.anthropic.serving import Messages
from app.auth import RequireApiKey
from app.chat_page import ChatPageResource
from app.engine.offload import run_blocking, spawn
from app.health import HealthResource, ModelState, RequireModel
from app.metrics import Metrics, MetricsResource, ObserveRequests, metrics_open, route_finder
from app.model_host import ServedModel, load_served_model
from app.llamacpp.completion.protocol import parse_completion_request
from app.llamacpp.completion.serving import Completion
from app.llamacpp.infill.protocol import parse_infill_request
from app.llamacpp.infill.serving import Infill
from app.llamacpp.model_loading import ModelLoadingResource
from app.llamacpp.props import PropsResource
from app.llamacpp.slots.routes import SlotsResource
from app.http import errors
from app.http.cancel import editor_key
from app.http.chat import ChatService
from app.http.cors import Cors
from app.http.generation_resource import GenerationResource
from app.http.head import Router as HeadRouter
from app.openai import errors as openai_errors
from app.openai.chat.routes import chat_completions_resource
from app.openai.chat.serving import ChatCompletions
from app.openai.completions.routes import completions_resource
from app.openai.completions.serving import Completions
from app.openai.models.routes import ModelsResource
from app.openai.responses.routes import StoredResponseResource, responses_resource
from app.openai.responses.serving import Responses
from app.openai.responses.store import ResponseStore
from app.openai.sessions import SessionsResource
from app.openai.tokenize.routes import TokenizerResource
from app.openai.tokenize.serving import Tokenization
from app.request_id import RequestId
from app.router.hosting import Router
from app.settings import Settings
from app.write_timeout import WriteTimeout


def add_model_routes(app: falcon.App, model: ServedModel, settings: Settings) -> None:
    chat_service = ChatService(model)  # the chat pipeline of chat completions, Responses and Messages
    chat = chat_completions_resource(ChatCompletions(chat_service), settings.max_body_bytes, sse_keepalive=settings.sse_keepalive)
    completions = completions_resource(Completions(model), settings.max_body_bytes,
                                       sse_keepalive=settings.sse_keepalive)
    tokenizer = TokenizerResource(Tokenization(model, chat_service), settings.max_body_bytes)
    models = ModelsResource(model, int(time.time()))
    sessions = SessionsResource(model)
    # llama.cpp's routes: their stream has no `data: [DONE]`; their errors take the default
    # (OpenAI's) envelope, in a stream too
    infill = GenerationResource(parse_infill_request, Infill(model), settings.max_body_bytes,
                                error_event=openai_errors.error_event, sse_keepalive=settings.sse_keepalive,
                                done=False, supersede=editor_key)
    app.add_route("/infill", infill)
    app.add_route("/slots", SlotsResource(model))
    completion = GenerationResource(parse_completion_request, Completion(model), settings.max_body_bytes,
                                    error_event=openai_errors.error_event, sse_keepalive=settings.sse_keepalive,
                                    done=False)
    app.add_route("/completion", completion)
    app.add_route("/props", PropsResource(model))
    loading = ModelLoadingResource(model, settings.max_body_bytes)  # llama.cpp's router routes
    app.add_route("/models/load", loading, suffix="load")
    app.add_route("/models/unload", loading, suffix="unload")
    responses_service = Responses(chat_service, ResponseStore(settings.responses_store_size,
                                                              settings.responses_store_mib * 1024 * 1024))
    responses = responses_resource(responses_service, settings.max_body_bytes, sse_keepalive=settings.sse_keepalive)
    stored_responses = StoredResponseResource(responses_service)
    for prefix in ("/v1", ""):
        app.add_route(f"{prefix}/chat/completions", chat)
        # llama.cpp's own /completions (no /v1) is its /completion; /v1/completions is OpenAI's
        app.add_route(f"{prefix}/completions", completions if prefix else completion)
        for name in ("tokenize", "detokenize", "apply-template"):
            app.add_route(f"{prefix}/{name}", tokenizer, suffix=name.replace("-", "_"))
        app.add_route(f"{prefix}/models", models)
        app.add_route(f"{prefix}/models/{{model_id}}", models, suffix="one")
        app.add_route(f"{prefix}/sessions", sessions)
        app.add_route(f"{prefix}/sessions/{{session_id}}", sessions, suffix="one")
        app.add_route(f"{prefix}/responses", responses)
        app.add_route(f"{prefix}/responses/{{response_id}}", stored_responses)
    anthropic_routes.add_routes(app, Messages(chat_service), settings.max_body_bytes,
                                sse_keepalive=settings.sse_keepalive)


# The model state of the app this process serves (the last one built), for `shutdown`.
_serving: ModelState | None = None


def shutdown(timeout: float) -> bool:
    """gunicorn's worker_exit hook (app/gunicorn_conf.py): before the worker process ends, the
    session states still queued for --session-dir reach the disk, for up to `timeout` seconds.
    False if some did not."""
    if _router is not None:
        return _router.flush(timeout)
    state = _serving
    if state is None or state.model is None:
        return True
    return state.model.engine.flush_sessions(timeout)


def build_app(settings: Settings, loader: Callable[[], ServedModel]) -> falcon.App:
    """The app answers at once; /health says "loading" until `loader` (run in the
    background, off the event loop) has produced the model and its routes exist."""
    global _serving
    app, _serving = model_app(settings, loader)
    return app


def model_app(settings: Settings, loader: Callable[[], ServedModel]) -> tuple[falcon.App, ModelState]:
    """One model's app and its state, the model loading in the background (build_app's, and each
    model's behind the router of --models-dir)."""
    state = ModelState()
    router = HeadRouter()
    metrics = state.metrics = Metrics(lambda: state.model.engine if state.model else None)  # the router reads it
    middleware = [ObserveRequests(metrics, route_finder(router)), RequestId(), WriteTimeout(settings.write_timeout),
                  Cors(settings.cors_origins, any_origin=bool(settings.api_key))]
    open_metrics = metrics_open(settings.metrics_auth)  # refuses a value it does not know
    if settings.api_key:  # the chat page holds no data; its API calls need the key
        middleware.append(RequireApiKey(settings.api_key, frozenset({"/", "/metrics"} if open_metrics else {"/"})))
    middleware.append(RequireModel(state, open_paths=frozenset({"/", "/metrics"})))
    app = falcon.App(middleware=middleware, router=router)
    app.req_options.strip_url_path_trailing_slash = True
    # OpenAI's envelope, but on the Messages API's routes Anthropic's
    errors.install(app, openai_errors.envelope, anthropic_routes.error_envelopes())
    app.add_route("/health", HealthResource(state))
    app.add_route("/metrics", MetricsResource(metrics))
    app.add_route("/", ChatPageResource(api_key_required=bool(settings.api_key)))

    def ready(model: ServedModel) -> None:
        add_model_routes(app, model, settings)
        model.engine.observers.append(metrics.observe_generation)

    def load() -> None:
        state.load(lambda: run_blocking(loader), ready)

    spawn(load)
    return app, state


# The router of --models-dir this process serves, if any, for `shutdown`.
_router: Router | None = None


def create_app(settings: Settings | None = None):
    global _router
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings or Settings.from_env()
    if settings.models_dir:
        _router = Router(settings, lambda s: model_app(s, lambda: load_served_model(s)))
        return _router
    return build_app(settings, lambda: load_served_model(settings))

