"""HTTP request metrics of a starlette app (the gateway and the config service): count and latency by route
template, model and status, recorded by `HttpMetrics.observe`, an observer of
`sie.telemetry.requests.ObservedRequests`, after the response is sent.

Label values are bounded: the route is the matched route's path template (`other` when none matched), the model
goes through `ModelLabels` (what the request path noted, else the route's `{model}` parameter), the status is the
HTTP status code. No web framework is imported here: the observer reads the ASGI scope only.
"""

from __future__ import annotations

from typing import Final

from sie.telemetry.metrics import OTHER, ModelLabels, Tally, Telemetry
from sie.telemetry.requests import RequestRecord, Scope, noted_model

# Request latencies from a probe (sub-millisecond) to a long batch (the 30 s default request timeout and over).
DURATION_BUCKETS_S: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_LABELS: Final = ("route", "model", "status")


class HttpMetrics:
    """`{prefix}.requests` and `{prefix}.request.duration`: prefix `sie.gateway` or `sie.config`."""

    def __init__(self, telemetry: Telemetry, prefix: str, models: ModelLabels) -> None:
        self.models = models
        # Requests by outcome: the error rate per route and model, and which models are used at all.
        self._requests = Tally(telemetry.meter, f"{prefix}.requests", "{request}", "HTTP requests answered.", _LABELS)
        # Latency as the client sees it, queueing and inference included: the SLO series.
        self._duration = telemetry.distribution(
            f"{prefix}.request.duration",
            "s",
            "Time from a request's arrival to the end of its answer.",
            _LABELS,
            DURATION_BUCKETS_S,
        )

    def request(self, route: str, model: str, status: int, seconds: float) -> None:
        labels = (route, model, str(status))
        self._requests.add(labels)
        self._duration.record(seconds, labels)

    def observe(self, scope: Scope, record: RequestRecord, status: int, seconds: float) -> None:
        """Record one answered request (a `RequestObserver`)."""
        model = noted_model(scope, record)
        self.request(_route(scope), self.models(model) if model is not None else OTHER, status, seconds)


def _route(scope: Scope) -> str:
    """The matched route's path template (starlette records the route in the scope), else `other`."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) else OTHER
