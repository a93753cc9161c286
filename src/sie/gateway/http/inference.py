"""The inference routes: `POST /v1/encode|score|extract/{model:path}` and the OpenAI `POST /v1/embeddings`. Each
handler decodes the request, makes one domain call and renders the answer.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from sie.gateway.http import openai
from sie.gateway.http.edge import (
    endpoint,
    incoming_trace,
    lane_hints,
    served_response,
    until_disconnect,
)
from sie.gateway.http.negotiation import decode_data, decode_request
from sie.gateway.http.replies import Surface
from sie.gateway.inference import InferenceService, Served
from sie.http.bodies import read_body
from sie.telemetry.requests import note_request
from sie.telemetry.tracing import GATEWAY_REQUEST, SERVER_SPAN, TraceHeaders, Tracing, trace_id_of
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
            request, functools.partial(openai.embeddings, self._service, call, lane_hints(request)), call.model
        )
        # OpenAI clients speak JSON: Accept is not consulted.
        return served_response(served, None, started)

    async def _serve(self, request: Request, work: Work, model: str | None = None) -> Served:
        """Run `work` until the client leaves, continuing the caller's trace; with tracing on, inside a
        `gateway.request` span whose trace id the answer names (X-Trace-ID)."""
        trace = incoming_trace(request)
        with self._tracing.span(GATEWAY_REQUEST, trace, kind=SERVER_SPAN) as span:
            carried = self._tracing.headers(span)  # None: tracing is off
            if carried is not None:
                span.set_attributes(_request_attributes(request, model))
            served = await until_disconnect(request, work(carried or trace))
            if carried is not None:
                meta = served.meta
                meta.trace_id = trace_id_of(span)
                span.set_attributes(
                    {"sie.request_id": meta.request_id, "sie.publish_ms": meta.publish_ms, "sie.wait_ms": meta.wait_ms}
                )
            return served


def _request_attributes(request: Request, model: str | None) -> dict[str, str]:
    """The `gateway.request` span's attributes: the method, the route template and the model (bounded)."""
    model = model if model is not None else request.path_params.get("model", "")
    route = request.scope.get("route")
    return {"http.request.method": request.method, "http.route": getattr(route, "path", ""),
            "sie.model": model[:_MAX_MODEL_ATTRIBUTE_CHARS]}  # fmt: skip
