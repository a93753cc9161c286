"""The config service's ASGI app (starlette): routes under `/v1/configs` plus `/healthz` and `/readyz`
(contracts Part A §2.4). Unknown routes and methods answer `{"detail": "Not Found"}`-style bodies.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sie.control.auth import AccessPolicy
from sie.control.http.handlers import MAX_BODY_BYTES, ControlHandlers, json_response
from sie.control.http.replies import error_reply
from sie.control.registry import ModelRegistry
from sie.control.writes import ConfigWriter
from sie.telemetry.access import log_access
from sie.telemetry.http import HttpMetrics
from sie.telemetry.requests import ObservedRequests, RequestObserver

logger = logging.getLogger(__name__)
PREFIX = "/v1/configs"


def _routes(handlers: ControlHandlers) -> list[Route]:
    return [
        Route(f"{PREFIX}/models", handlers.list_models, methods=["GET"]),
        Route(f"{PREFIX}/models/{{model_id:path}}", handlers.get_model, methods=["GET"]),
        Route(f"{PREFIX}/bundles", handlers.list_bundles, methods=["GET"]),
        Route(f"{PREFIX}/bundles/{{bundle_id}}", handlers.get_bundle, methods=["GET"]),
        Route(f"{PREFIX}/resolve", handlers.resolve, methods=["POST"]),
        *write_routes(handlers),
        Route("/healthz", handlers.healthz, methods=["GET"]),
        Route("/readyz", handlers.readyz, methods=["GET"]),
    ]


def write_routes(handlers: ControlHandlers) -> list[Route]:
    """The writes (add, replace, delete a model) and what workers reconcile from (epoch, export): what a server that
    answers the read side from its own catalogue (`sie run --role all`) adds to take configuration changes."""
    return [
        Route(f"{PREFIX}/models", handlers.add_model, methods=["POST"]),
        Route(f"{PREFIX}/models/{{model_id:path}}", handlers.replace_model, methods=["PUT"]),
        Route(f"{PREFIX}/models/{{model_id:path}}", handlers.delete_model, methods=["DELETE"]),
        Route(f"{PREFIX}/epoch", handlers.epoch, methods=["GET"]),
        Route(f"{PREFIX}/export", handlers.export, methods=["GET"]),
    ]


async def _http_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, HTTPException):
        return await _unexpected(request, exc)
    return json_response({"detail": exc.detail}, exc.status_code)


async def _unexpected(request: Request, exc: Exception) -> Response:
    logger.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    reply = error_reply(exc)
    return json_response(reply.body, reply.status)


def build_control_app(  # noqa: PLR0913 - the app's parts, then what each role adds
    writer: ConfigWriter,
    registry: ModelRegistry,
    policy: AccessPolicy,
    *,
    max_body_bytes: int = MAX_BODY_BYTES,
    metrics: HttpMetrics | None = None,
    extra_routes: Sequence[BaseRoute] = (),
    access_log: bool = True,
) -> Starlette:
    """The config service app over an already-built writer and registry; `metrics` (when given) records every
    request, `extra_routes` (`/metrics`) are served beside the API; without `access_log` requests are not logged
    (the app `all` reads its own epoch and export through: no client's traffic)."""
    handlers = ControlHandlers(writer, registry, policy, max_body_bytes)
    observers: list[RequestObserver] = [*([log_access] if access_log else []), *([metrics.observe] if metrics else [])]
    middleware = [Middleware(ObservedRequests, observers=observers)]
    app = Starlette(
        routes=[*_routes(handlers), *extra_routes],
        middleware=middleware,
        exception_handlers={HTTPException: _http_error, Exception: _unexpected},
    )
    app.state.handlers = handlers
    return app
