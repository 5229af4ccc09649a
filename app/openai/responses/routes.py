"""HTTP for the Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}."""

from __future__ import annotations

import falcon

from app.http.errors import APIError, to_api_error
from app.http.generation_resource import GenerationResource
from app.http.sessions import client_of
from app.http.sse import Event, Named

from . import shapes
from .protocol import parse_responses_request
from .serving import Responses, not_found


def error_event(ex: Exception) -> Event:
    """An error that escaped the service's own event sequence (it numbers and ends its stream itself)."""
    err = to_api_error(ex)
    return Named("error", {**shapes.error_event(err.code, err.message, err.param), "sequence_number": 0})


def responses_resource(service: Responses, max_body_bytes: int, *, sse_keepalive: float = 0.0) -> GenerationResource:
    return GenerationResource(parse_responses_request, service, max_body_bytes, sse_keepalive=sse_keepalive,
                              error_event=error_event, done=False)


class StoredResponseResource:
    """GET /v1/responses/{id} returns a stored response; DELETE forgets it."""

    def __init__(self, service: Responses):
        self.service = service

    def on_get(self, req: falcon.Request, resp: falcon.Response, response_id: str) -> None:
        entry = self.service.store.get(response_id, client_of(req))
        if entry is None:
            raise _unknown(response_id)
        resp.media = entry.response

    def on_delete(self, req: falcon.Request, resp: falcon.Response, response_id: str) -> None:
        if not self.service.store.delete(response_id, client_of(req)):
            raise _unknown(response_id)
        resp.media = shapes.deleted(response_id)


def _unknown(response_id: str) -> APIError:
    err = not_found(response_id)
    err.param = "response_id"
    return err
