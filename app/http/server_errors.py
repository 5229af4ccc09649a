"""What gunicorn answers itself, before the app sees a request (a request line or header it
cannot parse, one too long, a chunked body it cannot frame): in the APIs' JSON error shape
instead of its HTML page.

gunicorn's worker writes those answers through `gunicorn.util.write_error(sock, status, reason,
message)`; `install()` (gunicorn's post_fork hook, app/gunicorn_conf.py) puts `write_error` here
in its place in the worker. The request line may be what failed to parse, so the route, and with
it the API, is unknown: the body carries both shapes' fields, OpenAI's
(`error.message/type/param/code`) and Anthropic's (`type: "error"`, `error.type/message`).
"""

from __future__ import annotations

import json

CODES = {400: "bad_request", 403: "forbidden", 414: "uri_too_long", 417: "expectation_failed",
         431: "headers_too_large", 501: "not_implemented"}


def error_body(status: int, reason: str, message: str) -> bytes:
    client = 400 <= status < 500
    text = f"{reason}: {message}" if message else reason
    return json.dumps({
        "type": "error",
        "error": {"message": text[:1000], "type": "invalid_request_error" if client else "api_error",
                  "param": None, "code": CODES.get(status, "bad_request" if client else "internal_error")},
    }).encode()


def write_error(sock, status_int: int, reason: str, mesg: str) -> None:
    from gunicorn import util

    body = error_body(int(status_int), reason, mesg)
    head = (f"HTTP/1.1 {int(status_int)} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    util.write_nonblock(sock, head.encode("latin-1") + body)


def install() -> None:
    from gunicorn import util

    util.write_error = write_error
