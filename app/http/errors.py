"""One error type for every API, the exceptions it stands for, and Falcon handlers that write it.

`APIError` is neutral: a status, a message and the fields an API may show (code, param, type,
headers). Each API renders it in its own envelope (app/openai/errors.py, app/anthropic/errors.py);
`install` picks the envelope by the request's path, so every error takes its route's shape,
wherever it was raised: the route's own code, this core, the middleware, Falcon's routing.
"""

from __future__ import annotations

import json
import logging
from typing import Callable, Mapping

import falcon

log = logging.getLogger("etserve")

# The WSGI environ key whose value ends the request's access log line (gunicorn_conf.py
# access_log_format: %({etserve.generation}e)s): a generation's tokens and timings, an error's code.
ACCESS_LOG_KEY = "etserve.generation"

# HTTP status -> error type, as OpenAI and Anthropic both name the client errors.
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type(status: int, overrides: Mapping[int, str] | None = None, *, server: str = "server_error") -> str:
    """The error type of `status`: an API's `overrides` first, then TYPES; any other status is an
    invalid request below 500 and `server` (the API's word for its own failure) from 500."""
    if overrides and status in overrides:
        return overrides[status]
    return TYPES.get(status, "invalid_request_error" if status < 500 else server)


class APIError(Exception):
    """An error a client sees: `status`, `message`, and `code`, `param`, `type` (None: the
    envelope derives it from the status) and `headers` where the API's envelope shows them."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type
        self.headers = headers or {}


def invalid_value(param: str, message: str) -> APIError:
    return APIError(400, message, code="invalid_value", param=param)


def model_not_found(name: str, available: str) -> APIError:
    """404 for a `model` this server does not have; `available` says what it has."""
    return APIError(404, f"the model '{name}' does not exist; {available}", code="model_not_found", param="model")


def to_api_error(ex: Exception) -> APIError:
    """The client-facing form of any exception; internals are logged, never sent."""
    from app.engine import NativeError, QueueFullError, QueueTimeoutError
    from app.grammar import GrammarError
    from app.admission import Busy
    from app.validation import InvalidInput

    if isinstance(ex, APIError):
        return ex
    if isinstance(ex, Busy):
        return APIError(429, ex.message, code="busy", headers={"Retry-After": str(ex.retry_after)})
    if isinstance(ex, InvalidInput):  # the shared validation layer (app/validation.py): a 400
        return APIError(400, ex.message, code=ex.code, param=ex.param)
    if isinstance(ex, QueueFullError):
        return APIError(429, str(ex), code="queue_full", headers={"Retry-After": "2"})
    if isinstance(ex, QueueTimeoutError):
        return APIError(503, str(ex), code="queue_timeout", headers={"Retry-After": "5"})
    if isinstance(ex, GrammarError):  # the request's grammar or schema hit a limit mid-generation
        log.warning("constrained decoding stopped: %s", ex)
        return APIError(400, f"the output could not be kept within the requested format: {_grammar_reason(ex)}",
                        code="grammar_failed")
    if isinstance(ex, NativeError):
        log.error("runtime error: %s", ex)
        return APIError(500, "the model runtime failed on this request", code="runtime_error")
    log.error("unhandled error", exc_info=ex)
    return APIError(500, "internal server error", code="internal_error")


def _grammar_reason(ex: Exception) -> str:
    """The matcher's reason without the parser state it appends (kilobytes of `<state>` and
    `<grammar>` dumps: the server log keeps them)."""
    text = str(ex)
    for cut in ("<state>", "<grammar>", "\n"):
        text = text.split(cut, 1)[0]
    text = text.strip()
    return (text[:300] + "...") if len(text) > 300 else (text or "the format allows no further output")


# An API's error body for an APIError.
Envelope = Callable[[APIError], dict]


class ErrorHandlers:
    """Falcon error handlers writing each error in the envelope of the API its path belongs to.

    `envelopes` maps path prefixes (e.g. "/v1/messages") to an API's envelope; a prefix covers
    itself and the paths under it; any other path takes `default`.
    """

    def __init__(self, default: Envelope, envelopes: dict[str, Envelope] | None = None):
        self.default = default
        self.envelopes = dict(envelopes or {})

    def envelope(self, path: str) -> Envelope:
        for prefix, envelope in self.envelopes.items():
            if path == prefix or path.startswith(prefix + "/"):
                return envelope
        return self.default

    def write(self, req, resp: falcon.Response, err: APIError) -> None:
        resp.status = falcon.code_to_http_status(err.status)
        resp.content_type = falcon.MEDIA_JSON
        resp.text = json.dumps(self.envelope(req.path)(err))
        req.env[ACCESS_LOG_KEY] = f"error={err.code or error_type(err.status)}"
        for name, value in err.headers.items():
            resp.set_header(name, value)

    def handle_api_error(self, req, resp, ex: APIError, params) -> None:
        self.write(req, resp, ex)

    def handle_http_error(self, req, resp, ex: falcon.HTTPError, params) -> None:
        """Falcon's own errors (unknown route, wrong method, ...) in our envelope."""
        status = ex.status_code
        if status == 404:
            message = f"no route for {req.method} {req.path}"
            code = "not_found"
        elif status == 405:
            message = f"method {req.method} is not allowed on {req.path}"
            code = "method_not_allowed"
        else:
            message = ex.description or ex.title or "request error"
            code = (ex.code if isinstance(ex.code, str) else None) or None
        err = APIError(status, message, code=code)
        self.write(req, resp, err)
        for name, value in (ex.headers or {}).items():
            if name.lower() != "content-type":
                resp.set_header(name, value)

    def handle_unexpected(self, req, resp, ex: Exception, params) -> None:
        """Anything else: log it with its traceback, tell the client nothing internal."""
        if isinstance(ex, falcon.HTTPError):
            self.handle_http_error(req, resp, ex, params)
            return
        self.write(req, resp, to_api_error(ex))


def install(app: falcon.App, default: Envelope, envelopes: dict[str, Envelope] | None = None) -> None:
    """Our error handlers: `default` is the envelope of every path `envelopes` (path prefix:
    envelope) does not give to another API."""
    handlers = ErrorHandlers(default, envelopes)
    app.add_error_handler(Exception, handlers.handle_unexpected)
    app.add_error_handler(falcon.HTTPError, handlers.handle_http_error)
    app.add_error_handler(APIError, handlers.handle_api_error)
