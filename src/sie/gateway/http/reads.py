"""The gateway's read surface: `GET /v1/models[/{model:path}]`, `/health`, and the plain-text probes `/healthz` and
`/readyz` (seed 000 §4, §14).
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from sie.gateway import models
from sie.gateway.http.edge import endpoint, json_response
from sie.gateway.http.headers import VERSION_HEADERS
from sie.gateway.http.replies import Surface
from sie.gateway.http.shutdown import ServingState
from sie.gateway.router import CatalogSource
from sie.gateway.status import ModelStatusSource


class ReadHandlers:
    """Model catalogue, health and probes. `/readyz` is the process's readiness only (seed 000 §4): 200 once the
    listener serves, until it drains, whatever the workers and the broker do, so a load balancer keeps sending the
    requests the inference path answers with a retryable 503. `routing_reason` (when given) says why requests cannot
    be routed now (the broker is not connected, the first round of worker heartbeats is not over), or None: `/health`
    shows it. `pinning` (when the gateway serves pools) names the pools pinning each model."""

    def __init__(
        self,
        catalog: CatalogSource,
        status: ModelStatusSource,
        serving: ServingState,
        configured_gpus: tuple[str, ...],
        routing_reason: Callable[[], str | None] | None = None,
        pinning: Callable[[], models.PinningPools] | None = None,
    ) -> None:
        self._catalog = catalog
        self._status = status
        self._serving = serving
        self._configured_gpus = configured_gpus
        self._routing_reason = routing_reason
        self._pinning = pinning

    @endpoint(Surface.NATIVE)
    async def list_models(self, request: Request) -> Response:
        return json_response(models.models_body(self._catalog(), self._status, self._pinned()))

    @endpoint(Surface.NATIVE)
    async def get_model(self, request: Request) -> Response:
        model_id = request.path_params["model"]
        return json_response(models.model_body(self._catalog(), model_id, self._status, self._pinned()))

    def _pinned(self) -> models.PinningPools | None:
        return self._pinning() if self._pinning is not None else None

    @endpoint(Surface.NATIVE)
    async def health(self, request: Request) -> Response:
        routing = self._routing_reason() if self._routing_reason is not None else None
        return json_response(models.health_body(self._catalog(), self._status, self._configured_gpus, routing))

    async def healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok", headers=VERSION_HEADERS)

    def is_ready(self) -> bool:
        """The process serves and is not draining (`/readyz`, KServe's server and model readiness)."""
        return self._serving.ready

    async def readyz(self, request: Request) -> Response:
        if self.is_ready():
            return PlainTextResponse("ok", headers=VERSION_HEADERS)
        text = "not ready: draining" if self._serving.draining else "not ready: starting"
        return PlainTextResponse(text, status_code=503, headers=VERSION_HEADERS)
