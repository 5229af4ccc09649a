"""Several models on one server (--models-dir; llama.cpp's router mode, Ollama's behaviour).

Each model, once loaded, is a whole single-model app of its own (app.wsgi.model_app: its engine,
routes, metrics), built with the server's settings. The router is the WSGI app in front of them:
it reads which model a request names (`model` in a JSON body, or `?model=`), loads that model on
its first request (the request waits for it), unloads the least recently used idle ones to stay
within --models-max and --models-mib (app/router/policy.py), and hands the request over unchanged.
It answers itself what spans the models: /health, the model list, and llama.cpp's router routes
POST /models/load and /models/unload.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import time
from pathlib import Path
from stat import S_ISREG
from typing import Callable, Iterable

import falcon
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from app.anthropic import routes as anthropic_routes
from app.auth import RequireApiKey
from app.chat_page import ChatPageResource
from app.http import errors
from app.http.body import read_as_json, read_json, read_model_name
from app.http.cors import Cors
from app.http.errors import APIError, model_not_found
from app.http.head import Router as HeadRouter
from app.metrics import metrics_open
from app.models.manifest import read_manifest
from app.openai import errors as openai_errors
from app.openai.models.routes import model_card
from app.request_id import RequestId
from app.settings import Settings

from . import catalog
from .policy import Loaded, WontFit, evictions

log = logging.getLogger("etserve")

ERROR_KEY = "etserve.router.error"  # the environ key of an error the router answers itself
POLL_S = 0.05  # how often a request waiting for a load or an idle model looks again
IDLE_WAIT_S = 30.0  # longest an unload waits for the model's last step (a token, or a prefill chunk)
# the router's own routes; the chat page and a browser's favicon ask load no model
OWN_PATHS = frozenset({"/health", "/v1/models", "/models", "/models/load", "/models/unload", "/",
                       "/favicon.ico", "/metrics"})


@dataclasses.dataclass
class Hosted:
    """One model of the catalog, loaded or not."""

    name: str
    directory: Path
    app: Callable | None = None  # its single-model WSGI app while loading or loaded
    state: object | None = None  # that app's app.health.ModelState
    busy: int = 0  # requests in flight (the router's count: from hand-over to the response's close)
    last_used: float = 0.0
    error: str | None = None  # why its last load failed (no paths)
    failed_files: tuple | None = None  # its files when that load failed: tried again once they change
    unloading: bool = False  # its runtime is being freed (once its last step has ended)

    @property
    def status(self) -> str:
        if self.unloading:
            return "unloading"
        if self.state is None:
            return "failed" if self.error else "unloaded"
        return {"ok": "loaded"}.get(self.state.status, self.state.status)  # loading, failed

    @property
    def changing(self) -> bool:
        """Loading or unloading: requests for it wait, and it keeps its room."""
        return self.status in ("loading", "unloading")


class _Released:
    """A response's body whose close() also ends the request's hold on its model."""

    def __init__(self, body: Iterable[bytes], done: Callable[[], None]):
        self._body, self._done = body, done

    def __iter__(self):
        return iter(self._body)

    def close(self) -> None:
        done, self._done = self._done, None
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            if done is not None:
                done()


class Router:
    def __init__(self, settings: Settings, model_app: Callable[[Settings], tuple[Callable, object]],
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        """`model_app(settings)` starts loading the model `settings` names and returns its app and
        its ModelState at once (app.wsgi.model_app)."""
        self.settings = settings
        self.models_dir = Path(settings.models_dir).expanduser()
        if settings.models_max < 1:
            raise ValueError(f"--models-max must be 1 or more, got {settings.models_max}")
        if settings.models_mib < 0:
            raise ValueError(f"--models-mib must be 0 (no cap) or more, got {settings.models_mib}")
        self.max_bytes = settings.models_mib * 2**20
        self._model_app = model_app
        self._clock, self._sleep = clock, sleep
        self.created = int(time.time())
        self.hosted: dict[str, Hosted] = {}
        self.refresh()
        log.info("router over %s: %d models (%s), at most %d loaded%s", self.models_dir, len(self.hosted),
                 ", ".join(self.hosted) or "none", settings.models_max,
                 f" and {settings.models_mib} MiB of .pte files" if self.max_bytes else "")
        self.own = self._own_app()

    # -- the catalog ----------------------------------------------------------------------------

    def refresh(self) -> None:
        """Read the directory again: new models join; a model whose directory went keeps its entry
        while loaded (it is served until unloaded), else leaves."""
        found = catalog.discover(self.models_dir)
        for name, directory in found.items():
            if name not in self.hosted:
                self.hosted[name] = Hosted(name, directory)
        for name in [n for n, h in self.hosted.items() if n not in found and h.state is None]:
            del self.hosted[name]

    def default_name(self) -> str | None:
        """The model a request that names none gets: the most recently used loaded one, else
        --model if the catalog has it, else the first by name."""
        loaded = [h for h in self.hosted.values() if h.status == "loaded"]
        if loaded:
            return max(loaded, key=lambda h: h.last_used).name
        if self.settings.model in self.hosted:
            return self.settings.model
        return next(iter(sorted(self.hosted)), None)

    def lookup(self, name: str | None) -> Hosted:
        if name is None:
            name = self.default_name()
            if name is None:
                raise APIError(503, f"no models: {self.models_dir} holds no directory with a model.pte",
                               code="no_models")
        if name not in self.hosted:
            self.refresh()
        if name not in self.hosted:
            raise model_not_found(name, f"this server has: {', '.join(sorted(self.hosted)) or 'none'}")
        return self.hosted[name]

    # -- loading and unloading ------------------------------------------------------------------

    def acquire(self, hosted: Hosted) -> None:
        """Wait until `hosted` is loaded (loading it, and unloading others to make room), then hold
        it for one request (release() lets go). APIError 503 when it fails to load, or when the
        room it needs stays held by requests in flight past --queue-timeout."""
        deadline = self._clock() + self.settings.queue_timeout
        while True:
            status = hosted.status
            if status == "loaded":
                hosted.busy += 1
                hosted.last_used = self._clock()
                return
            if status == "failed" and hosted.state is not None:  # this attempt failed: say so
                hosted.error = hosted.state.public_error or "the model failed to load; the server log says why"
                hosted.app = hosted.state = None
                hosted.failed_files = _files_of(hosted.directory)
                raise self._failed(hosted)
            if status == "failed" and hosted.failed_files == _files_of(hosted.directory):
                # the same files fail the same way: no other model is unloaded to try them again
                raise self._failed(hosted)
            if not hosted.changing:  # unloaded, or failed before with other files: (try to) load it
                plan = self._plan(hosted)
                if plan:
                    for name in plan:
                        self.unload(self.hosted[name])
                    continue  # unloading may wait: what others did meanwhile is planned with again
                if plan is not None:
                    self._load(hosted)
                    continue
                if self._clock() >= deadline:
                    raise APIError(503, f"the model '{hosted.name}' needs the room of a loaded model, and "
                                   f"every loaded model is busy (--models-max {self.settings.models_max})",
                                   code="models_busy", headers={"Retry-After": "5"})
            self._sleep(POLL_S)

    @staticmethod
    def _failed(hosted: Hosted) -> APIError:
        return APIError(503, f"the model '{hosted.name}' failed to load: {hosted.error}", code="model_failed",
                        headers={"Retry-After": "5"})

    def release(self, hosted: Hosted) -> None:
        hosted.busy -= 1
        hosted.last_used = self._clock()

    def _plan(self, hosted: Hosted) -> list[str] | None:
        loaded = [Loaded(h.name, catalog.size_of(h.directory), h.busy + h.changing, h.last_used)
                  for h in self.hosted.values() if h.state is not None]
        try:
            return evictions(loaded, catalog.size_of(hosted.directory), self.settings.models_max, self.max_bytes)
        except WontFit:
            raise APIError(503, f"the model '{hosted.name}' is larger than --models-mib "
                           f"{self.settings.models_mib}", code="model_too_large") from None

    def _load(self, hosted: Hosted) -> None:
        base = self.settings
        session_dir = str(Path(base.session_dir) / hosted.name) if base.session_dir else ""
        settings = dataclasses.replace(base, models_dir="", model_path=str(hosted.directory),
                                       model_id=hosted.name, session_dir=session_dir)
        log.info("loading model '%s' from %s", hosted.name, hosted.directory)
        hosted.error = None
        hosted.app, hosted.state = self._model_app(settings)

    def unload(self, hosted: Hosted) -> None:
        """Let an idle model go: its session states reach --session-dir, its runtime is freed.
        Meanwhile it is `unloading`: requests for it wait, and it keeps its room."""
        if hosted.unloading or hosted.state is None:
            return
        hosted.unloading = True
        try:
            model = getattr(hosted.state, "model", None)
            if model is not None:
                engine = model.engine
                # its last request's response may have closed with that request's step still
                # running in the native thread pool (it ends at its next token): freeing the runtime
                # under it killed the worker
                if engine.wait_idle(IDLE_WAIT_S):
                    engine.flush_sessions(10.0)
                    engine.model.close()
                else:
                    # not freed under it: the runtime goes with the last reference, once that ends
                    log.error("model '%s' still runs a request after %.0f s: its runtime is freed when "
                              "that request ends", hosted.name, IDLE_WAIT_S)
            hosted.app = hosted.state = None
        finally:
            hosted.unloading = False
        log.info("unloaded model '%s'", hosted.name)

    def flush(self, timeout: float) -> bool:
        """Every loaded model's session states to disk (gunicorn's worker_exit)."""
        ok = True
        for h in self.hosted.values():
            model = getattr(h.state, "model", None)
            if model is not None:
                ok = model.engine.flush_sessions(timeout) and ok
        return ok

    # -- WSGI -----------------------------------------------------------------------------------

    def __call__(self, environ: dict, start_response):
        path = (environ.get("PATH_INFO") or "/").rstrip("/") or "/"
        # preflights and refused requests are the router's own to answer: no model loads for them
        if (path in OWN_PATHS or path.startswith(("/v1/models/", "/models/")) or environ.get("REQUEST_METHOD") == "OPTIONS"
                or self._refused(environ)):
            return self.own(environ, start_response)
        try:
            hosted = self.lookup(self._named(environ))
            self.acquire(hosted)
        except APIError as e:
            environ[ERROR_KEY] = e
            return self.own(environ, start_response)
        try:
            body = hosted.app(environ, start_response)
        except BaseException:
            self.release(hosted)
            raise
        return _Released(body, lambda: self.release(hosted))

    def _refused(self, environ: dict) -> bool:
        """Whether the origin or the API key check refuses the request (the router's own app then
        answers it with the 403 or 401): checked before a model is loaded for it."""
        if environ.get("HTTP_ORIGIN") is not None and not self._cors.allows(
                environ["HTTP_ORIGIN"], environ.get("HTTP_HOST"), environ.get("HTTP_X_FORWARDED_HOST")):
            return True
        if self._auth is None:  # (the router's own routes, OWN_PATHS, never come here)
            return False
        try:
            self._auth.process_request(falcon.Request(environ), None)
        except APIError:
            return True
        return False

    def _named(self, environ: dict) -> str | None:
        """The model the request names: `model` in its JSON body (read here, then given back to the
        model's app as it came), else `?model=`; None for none. APIError for a body read_json
        refuses (too large, not JSON), in the route's own shape."""
        record = None
        if environ.get("REQUEST_METHOD") in ("POST", "PUT", "PATCH") and read_as_json(environ.get("CONTENT_TYPE")):
            record = environ["wsgi.input"] = _Recording(environ["wsgi.input"])
        req = falcon.Request(environ)
        name = req.get_param("model") or None
        if record is None:
            return name
        try:
            body = read_json(req, self.settings.max_body_bytes)
        finally:
            environ["wsgi.input"] = io.BytesIO(record.data)
            environ["CONTENT_LENGTH"] = str(len(record.data))
            environ.pop("HTTP_TRANSFER_ENCODING", None)
        named = body.get("model") if isinstance(body, dict) else None
        return named if isinstance(named, str) and named else name

    # -- the router's own routes ----------------------------------------------------------------

    def _own_app(self) -> falcon.App:
        # as a model's app: the chat page open, /metrics as --metrics-auth says
        open_paths = frozenset({"/", "/favicon.ico"} | ({"/metrics"} if metrics_open(self.settings.metrics_auth)
                                                       else set()))
        self._auth = RequireApiKey(self.settings.api_key, open_paths) if self.settings.api_key else None
        self._cors = Cors(self.settings.cors_origins, any_origin=bool(self.settings.api_key))
        middleware: list = [RequestId(), self._cors]
        if self._auth is not None:
            middleware.append(self._auth)
        app = falcon.App(middleware=middleware, router=HeadRouter())
        app.req_options.strip_url_path_trailing_slash = True
        errors.install(app, openai_errors.envelope, anthropic_routes.error_envelopes())
        app.add_route("/health", _Health(self))
        app.add_route("/", ChatPageResource(api_key_required=bool(self.settings.api_key)))
        app.add_route("/metrics", _Metrics(self))
        models = _Models(self)
        for prefix in ("/v1", ""):
            app.add_route(f"{prefix}/models", models)
            app.add_route(f"{prefix}/models/{{model_id}}", models, suffix="one")
        app.add_route("/models/load", _Load(self, load=True))
        app.add_route("/models/unload", _Load(self, load=False))
        app.add_sink(_raise_routed_error)
        return app

    def card(self, hosted: Hosted) -> dict:
        model = getattr(hosted.state, "model", None)
        if model is not None and hosted.status == "loaded":
            card = model_card(model, self.created)
        else:
            card = {"id": hosted.name, "object": "model", "created": self.created, "owned_by": "etserve",
                    "type": "model", "display_name": hosted.name}
            context = _manifest_context(hosted.directory)
            if context:
                card.update(context_length=context, max_model_len=context, context_window=context,
                            meta={"n_ctx": context})
        card["status"] = {"value": hosted.status}
        if hosted.error and hosted.status == "failed":
            card["status"]["error"] = hosted.error
        return card


class _Recording:
    """A WSGI input stream that keeps what is read from it."""

    def __init__(self, stream):
        self._stream, self._chunks = stream, []

    @property
    def data(self) -> bytes:
        return b"".join(self._chunks)

    def read(self, size: int = -1) -> bytes:
        chunk = self._stream.read() if size is None or size < 0 else self._stream.read(size)
        self._chunks.append(chunk)
        return chunk

    def readline(self, size: int = -1) -> bytes:
        line = self._stream.readline(size)
        self._chunks.append(line)
        return line


def _files_of(directory: Path) -> tuple | None:
    """The model directory's files as (name, size, mtime): what a fix of a broken model changes."""
    try:
        stats = ((p.name, p.stat()) for p in directory.iterdir())
        return tuple(sorted((name, st.st_size, st.st_mtime_ns) for name, st in stats if S_ISREG(st.st_mode)))
    except OSError:
        return None


def _manifest_context(directory: Path) -> int | None:
    """The context an unloaded model was built with, from its etserve.json (None without one)."""
    value = (read_manifest(directory) or {}).get("max_seq_len")
    return value if isinstance(value, int) and value > 0 else None


def _raise_routed_error(req: falcon.Request, resp: falcon.Response, **_) -> None:
    err = req.env.get(ERROR_KEY)
    if err is None:  # cannot happen: the router sends here only requests it refused
        raise APIError(404, f"no route for {req.method} {req.path}", code="not_found")
    raise err


class _Health:
    def __init__(self, router: Router):
        self.router = router

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        r = self.router
        r.refresh()
        body = {"status": "ok", "mode": "router",
                "models": {h.name: {"status": h.status, "busy": h.busy} for h in r.hosted.values()},
                "models_max": r.settings.models_max}
        if not r.hosted:  # every request would be a 503 no_models: a health check must not pass
            body["status"] = "no_models"
            body["error"] = "the models directory holds no directory with a model.pte"
            resp.status = falcon.HTTP_503
        resp.media = body



class _Metrics:
    """GET /metrics of a router: every loaded model's metrics with a `model` label, and each model's
    status; loads nothing (a scrape of an idle router must not load a model)."""

    def __init__(self, router: Router):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_ModelsCollector(router))

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = CONTENT_TYPE_LATEST
        resp.data = generate_latest(self.registry)


class _ModelsCollector:
    def __init__(self, router: Router):
        self.router = router

    def collect(self):
        router = self.router
        router.refresh()
        hosted = sorted(router.hosted.values(), key=lambda h: h.name)
        families: dict[str, Metric] = {}
        for h in hosted:
            metrics = getattr(h.state, "metrics", None) if h.status == "loaded" else None
            if metrics is None:
                continue
            for family in metrics.registry.collect():
                out = families.get(family.name)
                if out is None:
                    out = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                for sample in family.samples:
                    out.add_sample(sample.name, {"model": h.name, **sample.labels}, sample.value, sample.timestamp,
                                   sample.exemplar)
        yield from families.values()
        status = GaugeMetricFamily("etserve_model_status", "Each model of the models directory: 1 for its status "
                                   "(loaded, loading, unloading, unloaded, failed)", labels=["model", "status"])
        for h in hosted:
            status.add_metric([h.name, h.status], 1)
        yield status


class _Models:
    def __init__(self, router: Router):
        self.router = router

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.router.refresh()
        cards = [self.router.card(h) for h in self.router.hosted.values()]
        resp.media = {"object": "list", "data": cards, "has_more": False,
                      "first_id": cards[0]["id"] if cards else None, "last_id": cards[-1]["id"] if cards else None}

    def on_get_one(self, req: falcon.Request, resp: falcon.Response, model_id: str) -> None:
        resp.media = self.router.card(self.router.lookup(model_id))


class _Load:
    """POST /models/load and /models/unload {"model": name} (llama.cpp's router routes)."""

    def __init__(self, router: Router, load: bool):
        self.router, self.load = router, load

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        name = read_model_name(req, self.router.settings.max_body_bytes)
        hosted = self.router.lookup(name)
        if self.load:
            self.router.acquire(hosted)
            self.router.release(hosted)
        elif hosted.state is not None:
            if hosted.busy or hosted.changing:
                raise APIError(409, f"the model '{name}' is busy; unload it when its requests have ended",
                               code="model_busy", headers={"Retry-After": "1"})
            self.router.unload(hosted)
        resp.media = {"success": True, "model": name, "status": hosted.status}
