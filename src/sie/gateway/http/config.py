"""The gateway's config read surface (seed 000 §5, §6; contracts Part B §1.10): `GET /v1/configs/models[/{id}]`
(YAML, or JSON worker-ack status for `…/status`), `GET /v1/configs/bundles[/{id}]`, `POST /v1/configs/resolve`.
Writes are not registered, so `POST /v1/configs/models` answers 405. Errors go through replies.py.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sie.gateway.config_sync.views import (
    ConfigView,
    HeartbeatSource,
    StaticConfigView,
    bundle_yaml,
    bundles_body,
    model_yaml,
    models_body,
    resolve_body,
    status_target,
    worker_ack_status,
)
from sie.gateway.errors import InvalidRequestError
from sie.gateway.http.edge import endpoint, json_response
from sie.gateway.http.headers import VERSION_HEADERS
from sie.gateway.http.replies import Surface
from sie.gateway.router import CatalogSource
from sie.http.bodies import read_body
from sie.wire import DecodeError, loads_json

YAML_MEDIA_TYPE = "application/x-yaml"
MAX_RESOLVE_BODY_BYTES = 64 * 1024


def yaml_response(text: str) -> Response:
    return Response(text, media_type=YAML_MEDIA_TYPE, headers=VERSION_HEADERS)


class ConfigReadHandlers:
    """Reads the registry view on every request; `heartbeats` None means no workers are known."""

    def __init__(self, view: ConfigView, heartbeats: HeartbeatSource | None) -> None:
        self._view = view
        self._heartbeats = heartbeats

    def _healthy(self) -> list[Any]:
        return list(self._heartbeats()) if self._heartbeats is not None else []

    @endpoint(Surface.NATIVE)
    async def list_models(self, request: Request) -> Response:
        return json_response(models_body(self._view))

    @endpoint(Surface.NATIVE)
    async def get_model(self, request: Request) -> Response:
        path_id = request.path_params["model_id"]
        catalog = self._view()
        target = status_target(catalog, path_id)
        if target is None:
            return yaml_response(model_yaml(self._view, path_id))
        return json_response(worker_ack_status(catalog, target, self._view.epoch.get(), self._healthy()))

    @endpoint(Surface.NATIVE)
    async def list_bundles(self, request: Request) -> Response:
        return json_response(bundles_body(self._view(), self._healthy()))

    @endpoint(Surface.NATIVE)
    async def get_bundle(self, request: Request) -> Response:
        return yaml_response(bundle_yaml(self._view(), request.path_params["bundle_id"]))

    @endpoint(Surface.NATIVE)
    async def resolve(self, request: Request) -> Response:
        raw = await read_body(request, MAX_RESOLVE_BODY_BYTES)
        try:
            data = loads_json(raw)
        except DecodeError as exc:
            raise InvalidRequestError(f"Invalid JSON: {exc}", code="parse_error") from exc
        return json_response(resolve_body(self._view(), data))


def config_routes(catalog: CatalogSource, heartbeats: HeartbeatSource | None) -> list[Route]:
    """Routes over `catalog` (a ConfigView when config sync runs) and the healthy workers' heartbeats, if the
    gateway hears any."""
    view = catalog if isinstance(catalog, ConfigView) else StaticConfigView(catalog)
    handlers = ConfigReadHandlers(view, heartbeats)
    return [
        Route("/v1/configs/models", handlers.list_models, methods=["GET"]),
        Route("/v1/configs/models/{model_id:path}", handlers.get_model, methods=["GET"]),
        Route("/v1/configs/bundles", handlers.list_bundles, methods=["GET"]),
        Route("/v1/configs/bundles/{bundle_id}", handlers.get_bundle, methods=["GET"]),
        Route("/v1/configs/resolve", handlers.resolve, methods=["POST"]),
    ]
