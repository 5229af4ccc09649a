"""Reading a JSON request body: size limit, content type, strict JSON."""

from __future__ import annotations

import json
from typing import Any

import falcon

from app import validation

from .errors import APIError, invalid_value

MAX_DEPTH = validation.MAX_DEPTH


def _has_lone_surrogate(body: Any) -> bool:
    """Only a \\u escape can put one in (the bytes were valid UTF-8); the tokenizer refuses it."""
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


try:
    from gunicorn.http.errors import ParseException as _ServerParseError
except ImportError:  # another WSGI server: its framing errors are OSErrors or ValueErrors
    class _ServerParseError(Exception):
        pass

_BROKEN_BODY = (_ServerParseError, OSError, ValueError)


def _describe(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text[:200]}" if text else type(e).__name__


def _charset(params: str) -> str | None:
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


# What `curl -d` and hand-written clients label a JSON body they forgot to label: read as JSON
# when it is (llama.cpp's server reads every body as JSON), else still a 415.
_MISLABELLED = ("application/x-www-form-urlencoded", "text/plain")


def read_as_json(content_type: str | None) -> bool:
    """Whether read_json reads a body of this Content-Type (None: none sent) rather than refusing
    it: JSON, or JSON mislabelled as curl -d labels it."""
    ctype = (content_type or "application/json").split(";")[0].strip().lower()
    return ctype == "application/json" or ctype.endswith("+json") or ctype in _MISLABELLED


def read_json(req: falcon.Request, max_bytes: int) -> Any:
    ctype, _, params = (req.content_type or "application/json").partition(";")
    ctype = ctype.strip().lower()
    unsupported = APIError(415, f"content type {ctype!r} is not supported; send application/json",
                           code="unsupported_media_type")
    mislabelled = ctype in _MISLABELLED
    if not read_as_json(ctype):
        raise unsupported
    charset = _charset(params)
    if charset not in (None, "utf-8", "utf8", "us-ascii"):
        raise APIError(415, f"charset {charset!r} is not supported; JSON bodies are UTF-8",
                       code="unsupported_media_type")
    encoding = (req.get_header("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity":
        raise APIError(415, f"Content-Encoding {encoding!r} is not supported; send the body uncompressed",
                       code="unsupported_media_type")
    length = req.content_length
    if length is not None and length > max_bytes:
        raise APIError(413, f"the request body is {length} bytes; the limit is {max_bytes}",
                       code="request_too_large")
    try:
        if length is None and req.env.get("wsgi.input_terminated"):
            # a chunked body: the server (gunicorn) ends the input where the body ends; Falcon's
            # bounded_stream would read nothing without a Content-Length
            raw = req.stream.read(max_bytes + 1)
        else:
            raw = req.bounded_stream.read(max_bytes + 1)
    except _BROKEN_BODY as e:
        # a chunked body the server cannot frame (a bad chunk size, a missing terminator, a bad
        # trailer), or a client gone mid-body
        raise APIError(400, f"the request body could not be read: {_describe(e)}", code="invalid_body") from None
    if len(raw) > max_bytes:
        raise APIError(413, f"the request body is over the limit of {max_bytes} bytes", code="request_too_large")
    if mislabelled and raw.lstrip()[:1] not in (b"{", b"["):
        raise unsupported  # a form, or text: not a JSON body
    if not raw:
        raise APIError(400, "the request body is empty; send a JSON object", code="invalid_json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise APIError(400, "the request body is not valid UTF-8", code="invalid_json") from None
    try:
        body = validation.loads(text, what="the request body")
    except validation.InvalidInput as e:
        if mislabelled:
            raise unsupported from None
        raise APIError(400, e.message, code="invalid_json") from None
    if "\\u" in text and _has_lone_surrogate(body):
        raise APIError(400, "the request body holds a lone UTF-16 surrogate escape (\\ud800-\\udfff), "
                       "which is not text", code="invalid_json")
    return body


def read_model_name(req: falcon.Request, max_bytes: int) -> str:
    """The model a `{"model": NAME}` body names (llama.cpp's POST /models/load and /models/unload)."""
    body = read_json(req, max_bytes)
    name = body.get("model") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise invalid_value("model", "`model` must name a model of this server")
    return name
