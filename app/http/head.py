"""HEAD wherever GET is answered: the same status and headers, no body.

Uptime monitors, load balancers and `curl -I` probe with HEAD (`HEAD /health`, `HEAD /v1/models`);
Falcon answers 405 for a method a resource has no responder for. This router gives every GET
responder (`on_get`, `on_get_<suffix>`) a HEAD twin before the route is mapped; Falcon and
gunicorn drop the body of a HEAD response.
"""

from __future__ import annotations

from typing import Any

import falcon.inspect
import falcon.routing


def with_head(resource: object, suffix: str | None = None) -> object:
    get, head = ("on_get", "on_head") if not suffix else (f"on_get_{suffix}", f"on_head_{suffix}")
    responder = getattr(resource, get, None)
    if responder is not None and getattr(resource, head, None) is None:
        setattr(resource, head, responder)
    return resource


class Router(falcon.routing.DefaultRouter):
    """Falcon's default router, HEAD answered where GET is."""

    def add_route(self, uri_template: str, resource: object, **kwargs: Any) -> None:
        super().add_route(uri_template, with_head(resource, kwargs.get("suffix")), **kwargs)


# falcon.inspect (route listings, the API-key test's walk over every route) reads it as the default router
falcon.inspect.register_router(Router)(falcon.inspect.inspect_compiled_router)
