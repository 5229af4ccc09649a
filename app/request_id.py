"""Every response carries an X-Request-Id (the client's, when it sent a sane one), the Messages API's also
Anthropic's Request-Id; logs name it too."""

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
        if req.path.startswith("/v1/messages"):  # the anthropic SDK reads `request-id` (Anthropic's header)
            resp.set_header("Request-Id", req.context.request_id)
