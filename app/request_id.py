"""Every response carries an X-Request-Id (the client's, when it sent a sane one) and the same id as
Anthropic's Request-Id, which the anthropic SDK reads (it calls /v1/models too); logs name it too."""

from __future__ import annotations

import re
import uuid

import falcon

_SANE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class RequestId:
    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        given = req.get_header("X-Request-Id") or ""
        req.context.request_id = given if _SANE.match(given) else uuid.uuid4().hex
        resp.set_header("X-Request-Id", req.context.request_id)
        # the anthropic SDK reads `request-id` (Anthropic's header): on /messages, /v1/models, every route
        resp.set_header("Request-Id", req.context.request_id)
