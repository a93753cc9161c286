"""Where telemetry goes besides `/metrics`: the resource that names this process (OTEL_SERVICE_NAME,
OTEL_RESOURCE_ATTRIBUTES) and the OTLP push of metrics (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, every OTEL_METRIC_EXPORT_INTERVAL ms), over HTTP/protobuf or gRPC
(OTEL_EXPORTER_OTLP_PROTOCOL; `otlp_exporter` picks the exporter of either signal). Values come from the settings
object, never from the environment: the SDK's own environment lookups are overridden by explicit arguments.
"""

from __future__ import annotations

import importlib
import os
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from opentelemetry.sdk.metrics.export import (
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from sie.settings import TelemetrySettings

METRICS_PATH: Final = "/v1/metrics"
GRPC: Final = "grpc"
# The OTLP exporter classes by protocol and signal: (module, class). The gRPC ones come with the `grpc` extra.
_EXPORTERS: Final = {
    ("http/protobuf", "metrics"): ("opentelemetry.exporter.otlp.proto.http.metric_exporter", "OTLPMetricExporter"),
    ("http/protobuf", "traces"): ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "OTLPSpanExporter"),
    (GRPC, "metrics"): ("opentelemetry.exporter.otlp.proto.grpc.metric_exporter", "OTLPMetricExporter"),
    (GRPC, "traces"): ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter", "OTLPSpanExporter"),
}
# Pushing never holds a shutdown up for long: a collector that is away loses the last interval.
EXPORT_TIMEOUT_S: Final = 5.0
# A fresh id per process start (seed 000 §15: resource identity includes service.instance.id).
_INSTANCE_ID: Final = str(uuid.uuid4())


def metrics_endpoint(settings: TelemetrySettings) -> str | None:
    """The URL metrics are pushed to: the metrics-specific one as given, else `{base}/v1/metrics` over HTTP or the
    base itself over gRPC; None: no push."""
    if settings.otlp_metrics_endpoint:
        return settings.otlp_metrics_endpoint
    if settings.otlp_endpoint:
        return settings.otlp_endpoint if settings.otlp_protocol == GRPC else settings.otlp_endpoint + METRICS_PATH
    return None


def otlp_exporter(protocol: str, signal: str, endpoint: str) -> Any:
    """The OTLP exporter of `signal` ("metrics", "traces") over `protocol`, pushing to `endpoint` (gRPC: plain
    text for an `http://` endpoint, TLS for `https://`); ValueError naming the extra when the gRPC one is not
    installed."""
    module_name, class_name = _EXPORTERS[protocol, signal]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        package = module_name.rsplit(".", 2)[0]
        raise ValueError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol} needs {package}: install the sie[grpc] extra"
        ) from exc
    options: dict[str, Any] = {"endpoint": endpoint, "timeout": EXPORT_TIMEOUT_S}
    if protocol == GRPC:
        options["insecure"] = endpoint.startswith("http://")
    return getattr(module, class_name)(**options)


def service_resource(
    settings: TelemetrySettings, default_name: str, attributes: Mapping[str, str] | None = None
) -> Resource:
    """service.name (OTEL_SERVICE_NAME, else `default_name`), service.instance.id, host.name, process.pid and
    `attributes` (an in-process worker child's name and device), then OTEL_RESOURCE_ATTRIBUTES, which may override
    any of them."""
    resource: dict[str, str | int] = {
        "service.name": settings.service_name or default_name,
        "service.instance.id": _INSTANCE_ID,
        "host.name": socket.gethostname(),
        "process.pid": os.getpid(),
        **(attributes or {}),
    }
    resource.update(dict(settings.resource_attributes))
    return Resource(resource)


ExtraMetrics = Callable[[], Sequence[Metric]]


class _PushWithExtras(MetricExporter):
    """An OTLP exporter (`inner`, of either protocol), each push carrying `extras()` in the scope named `scope` beside
    what the SDK collected (in the first resource's metrics: one MeterProvider, one resource)."""

    def __init__(self, inner: MetricExporter, extras: ExtraMetrics, scope: str) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,  # noqa: SLF001 - the SDK keeps them there
            preferred_aggregation=inner._preferred_aggregation,  # noqa: SLF001
        )
        self._inner = inner
        self._extras = extras
        self._scope = InstrumentationScope(scope)

    def export(
        self, metrics_data: MetricsData, timeout_millis: float | None = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        extra = list(self._extras())
        if extra and metrics_data.resource_metrics:
            first, *rest = metrics_data.resource_metrics
            scopes = list(first.scope_metrics)
            # Into the SDK's own scope of that name when it has one: the encoder keeps one scope per name.
            index = next((i for i, scope in enumerate(scopes) if scope.scope.name == self._scope.name), None)
            if index is None:
                scopes.append(ScopeMetrics(scope=self._scope, metrics=extra, schema_url=""))
            else:
                same = scopes[index]
                scopes[index] = ScopeMetrics(
                    scope=same.scope, metrics=[*same.metrics, *extra], schema_url=same.schema_url
                )
            merged = ResourceMetrics(resource=first.resource, scope_metrics=scopes, schema_url=first.schema_url)
            metrics_data = MetricsData(resource_metrics=[merged, *rest])
        return self._inner.export(metrics_data, timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def otlp_metric_reader(
    settings: TelemetrySettings, extras: ExtraMetrics | None = None, scope: str = "sie"
) -> PeriodicExportingMetricReader | None:
    """A reader pushing every instrument over OTLP (HTTP/protobuf or gRPC), and `extras()` in the instrumentation
    scope `scope` (the meter's) with each push, or None when no endpoint is set."""
    endpoint = metrics_endpoint(settings)
    if endpoint is None:
        return None
    exporter = _PushWithExtras(otlp_exporter(settings.otlp_protocol, "metrics", endpoint), extras or list, scope)
    interval_ms = settings.otlp_metric_export_interval_ms
    return PeriodicExportingMetricReader(
        exporter, export_interval_millis=interval_ms, export_timeout_millis=EXPORT_TIMEOUT_S * 1000
    )
