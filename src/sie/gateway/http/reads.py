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
    """Model catalogue, health and probes; `unready_reason` (when given) says why the gateway cannot serve now,
    say its broker is not connected yet, or None when it can."""

    def __init__(
        self,
        catalog: CatalogSource,
        status: ModelStatusSource,
        serving: ServingState,
        configured_gpus: tuple[str, ...],
        unready_reason: Callable[[], str | None] | None = None,
    ) -> None:
        self._catalog = catalog
        self._status = status
        self._serving = serving
        self._configured_gpus = configured_gpus
        self._unready_reason = unready_reason

    @endpoint(Surface.NATIVE)
    async def list_models(self, request: Request) -> Response:
        return json_response(models.models_body(self._catalog(), self._status))

    @endpoint(Surface.NATIVE)
    async def get_model(self, request: Request) -> Response:
        return json_response(models.model_body(self._catalog(), request.path_params["model"], self._status))

    @endpoint(Surface.NATIVE)
    async def health(self, request: Request) -> Response:
        return json_response(models.health_body(self._catalog(), self._status, self._configured_gpus))

    async def healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok", headers=VERSION_HEADERS)

    def not_ready_because(self) -> str | None:
        """Why the gateway cannot serve now ("" when it is not started or is draining); None when it can."""
        reason = self._unready_reason() if self._unready_reason is not None else None
        if reason is not None:
            return reason
        return None if self._serving.ready else ""

    def is_ready(self) -> bool:
        return self.not_ready_because() is None

    async def readyz(self, request: Request) -> Response:
        reason = self.not_ready_because()
        if reason is None:
            return PlainTextResponse("ok", headers=VERSION_HEADERS)
        text = f"not ready: {reason}" if reason else "not ready"
        return PlainTextResponse(text, status_code=503, headers=VERSION_HEADERS)
