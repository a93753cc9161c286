"""HTTP request metrics of a starlette app (the gateway and the config service): count and latency by route
template, model and status, recorded by one pure ASGI middleware (STYLE habit 11) after the response is sent.

Label values are bounded: the route is the matched route's path template (`other` when none matched), the model
goes through `ModelLabels` (the route's `{model}` parameter, or what a handler noted with `note_model`), the
status is the HTTP status code. No web framework is imported here: the middleware reads the ASGI scope only.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from opentelemetry.metrics import Meter

from sie.telemetry.metrics import OTHER, ModelLabels, Tally

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Where a handler notes the model of a request whose path does not name it (OpenAI `/v1/embeddings`).
MODEL_STATE_KEY: Final = "sie_model"
# Request latencies from a probe (sub-millisecond) to a long batch (the 30 s default request timeout and over).
DURATION_BUCKETS_S: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_LABELS: Final = ("route", "model", "status")


def note_model(scope: Scope, model: str) -> None:
    """Label this request's metrics with `model` (for a route whose path has no `{model}` parameter)."""
    scope.setdefault("state", {})[MODEL_STATE_KEY] = model


class HttpMetrics:
    """`{prefix}.requests` and `{prefix}.request.duration`: prefix `sie.gateway` or `sie.config`."""

    def __init__(self, meter: Meter, prefix: str, models: ModelLabels) -> None:
        self.models = models
        # Requests by outcome: the error rate per route and model, and which models are used at all.
        self._requests = Tally(meter, f"{prefix}.requests", "{request}", "HTTP requests answered.", _LABELS)
        # Latency as the client sees it, queueing and inference included: the SLO series.
        self._duration = meter.create_histogram(
            f"{prefix}.request.duration",
            unit="s",
            description="Time from a request's arrival to the end of its answer.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )

    def request(self, route: str, model: str, status: int, seconds: float) -> None:
        labels = (route, model, str(status))
        self._requests.add(labels)
        self._duration.record(seconds, dict(zip(_LABELS, labels, strict=True)))


class RequestMetricsMiddleware:
    """Records every HTTP request of the app it wraps into `metrics` (websocket and lifespan pass through)."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an app that raises before answering: the server answers 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.request(_route(scope), self._model(scope), status, time.perf_counter() - started)

    def _model(self, scope: Scope) -> str:
        params = scope.get("path_params", {})
        model = params.get("model") or params.get("model_id") or scope.get("state", {}).get(MODEL_STATE_KEY)
        return self.metrics.models(model) if isinstance(model, str) else OTHER


def _route(scope: Scope) -> str:
    """The matched route's path template (starlette records the route in the scope), else `other`."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) else OTHER
