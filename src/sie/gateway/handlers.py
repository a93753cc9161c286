"""HTTP handlers of the gateway: each decodes the request, makes one domain call and renders the answer.

Inference: `POST /v1/encode|score|extract/{model:path}` and the OpenAI `POST /v1/embeddings`. Read surface:
`GET /v1/models[/{model:path}]`, `/health`, and the plain-text probes `/healthz` and `/readyz` (seed 000 §4, §14).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from sie.gateway import models, openai
from sie.gateway.edge import (
    endpoint,
    incoming_trace,
    json_response,
    lane_hints,
    served_response,
    until_disconnect,
)
from sie.gateway.headers import VERSION_HEADERS
from sie.gateway.negotiation import decode_data, decode_request
from sie.gateway.replies import Surface
from sie.gateway.router import CatalogSource
from sie.gateway.service import InferenceService, Served
from sie.gateway.shutdown import ServingState
from sie.gateway.status import ModelStatusSource
from sie.http.bodies import read_body
from sie.telemetry.requests import note_request
from sie.telemetry.tracing import GATEWAY_REQUEST, SpanKind, TraceHeaders, Tracing, trace_id_of
from sie.wire.http import EncodeRequest, ExtractRequest, ScoreRequest

T = TypeVar("T")
Work = Callable[[TraceHeaders | None], Awaitable[Served]]
# A span attribute holds at most this much of a model name the caller wrote.
_MAX_MODEL_ATTRIBUTE_CHARS: Final = 256


class InferenceHandlers:
    """The queue-backed inference routes; with `tracing` on, each request is a `gateway.request` span whose context
    its work items carry (else they carry the caller's `traceparent`, if any)."""

    def __init__(self, service: InferenceService, max_body_bytes: int, tracing: Tracing | None = None) -> None:
        self._service = service
        self._max_body_bytes = max_body_bytes
        self._tracing = tracing or Tracing.off()

    async def _decode(self, request: Request, cls: type[T]) -> T:
        body = await read_body(request, self._max_body_bytes)
        return decode_request(body, request.headers.get("content-type"), cls)

    @endpoint(Surface.NATIVE)
    async def encode(self, request: Request) -> Response:
        started = time.perf_counter()
        body = await self._decode(request, EncodeRequest)
        work = functools.partial(self._service.encode, request.path_params["model"], body, lane_hints(request))
        return served_response(await self._serve(request, work), request.headers.get("accept"), started)

    @endpoint(Surface.NATIVE)
    async def score(self, request: Request) -> Response:
        started = time.perf_counter()
        body = await self._decode(request, ScoreRequest)
        work = functools.partial(self._service.score, request.path_params["model"], body, lane_hints(request))
        return served_response(await self._serve(request, work), request.headers.get("accept"), started)

    @endpoint(Surface.NATIVE)
    async def extract(self, request: Request) -> Response:
        started = time.perf_counter()
        body = await self._decode(request, ExtractRequest)
        work = functools.partial(self._service.extract, request.path_params["model"], body, lane_hints(request))
        return served_response(await self._serve(request, work), request.headers.get("accept"), started)

    @endpoint(Surface.OPENAI)
    async def embeddings(self, request: Request) -> Response:
        started = time.perf_counter()
        raw = await read_body(request, self._max_body_bytes)
        call = openai.parse_embeddings(decode_data(raw, request.headers.get("content-type")))
        note_request(model=call.model)  # for the access line and the metrics: this path names no model
        served = await self._serve(
            request, functools.partial(self._service.embeddings, call, lane_hints(request)), call.model
        )
        # OpenAI clients speak JSON: Accept is not consulted.
        return served_response(served, None, started)

    async def _serve(self, request: Request, work: Work, model: str | None = None) -> Served:
        """Run `work` until the client leaves, continuing the caller's trace; with tracing on, inside a
        `gateway.request` span whose trace id the answer names (X-Trace-ID)."""
        trace = incoming_trace(request)
        if not self._tracing.enabled:
            return await until_disconnect(request, work(trace))
        model = model if model is not None else request.path_params.get("model", "")
        route = request.scope.get("route")
        attributes = {"http.request.method": request.method, "http.route": getattr(route, "path", ""),
                      "sie.model": model[:_MAX_MODEL_ATTRIBUTE_CHARS]}  # fmt: skip
        with self._tracing.span(GATEWAY_REQUEST, [trace], attributes, kind=SpanKind.SERVER) as span:
            served = await until_disconnect(request, work(self._tracing.headers(span)))
            meta = served.meta
            meta.trace_id = trace_id_of(span)
            span.set_attributes(
                {"sie.request_id": meta.request_id, "sie.publish_ms": meta.publish_ms, "sie.wait_ms": meta.wait_ms}
            )
            return served


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

    async def readyz(self, request: Request) -> Response:
        reason = self._unready_reason() if self._unready_reason is not None else None
        if self._serving.ready and reason is None:
            return PlainTextResponse("ok", headers=VERSION_HEADERS)
        text = "not ready" if reason is None else f"not ready: {reason}"
        return PlainTextResponse(text, status_code=503, headers=VERSION_HEADERS)
