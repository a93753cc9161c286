"""Where telemetry goes besides `/metrics`: the resource that names this process (OTEL_SERVICE_NAME,
OTEL_RESOURCE_ATTRIBUTES) and the OTLP/HTTP protobuf push of metrics (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, every OTEL_METRIC_EXPORT_INTERVAL ms). Values come from the settings object,
never from the environment: the SDK's own environment lookups are overridden by explicit arguments.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import (
    Metric,
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
# Pushing never holds a shutdown up for long: a collector that is away loses the last interval.
EXPORT_TIMEOUT_S: Final = 5.0
# A fresh id per process start (seed 000 §15: resource identity includes service.instance.id).
_INSTANCE_ID: Final = str(uuid.uuid4())


def metrics_endpoint(settings: TelemetrySettings) -> str | None:
    """The URL metrics are pushed to: the metrics-specific one as given, else `{base}/v1/metrics`; None: no push."""
    if settings.otlp_metrics_endpoint:
        return settings.otlp_metrics_endpoint
    if settings.otlp_endpoint:
        return settings.otlp_endpoint + METRICS_PATH
    return None


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


class _PushWithExtras(OTLPMetricExporter):
    """The OTLP exporter, each push carrying `extras()` in the scope named `scope` beside what the SDK collected (in
    the first resource's metrics: one MeterProvider, one resource)."""

    def __init__(self, extras: ExtraMetrics, scope: str, **options: Any) -> None:
        super().__init__(**options)
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
        return super().export(metrics_data, timeout_millis, **kwargs)


def otlp_metric_reader(
    settings: TelemetrySettings, extras: ExtraMetrics | None = None, scope: str = "sie"
) -> PeriodicExportingMetricReader | None:
    """A reader pushing every instrument over OTLP/HTTP protobuf, and `extras()` in the instrumentation scope `scope`
    (the meter's) with each push, or None when no endpoint is set."""
    endpoint = metrics_endpoint(settings)
    if endpoint is None:
        return None
    exporter = _PushWithExtras(extras or list, scope, endpoint=endpoint, timeout=EXPORT_TIMEOUT_S)
    interval_ms = settings.otlp_metric_export_interval_ms
    return PeriodicExportingMetricReader(
        exporter, export_interval_millis=interval_ms, export_timeout_millis=EXPORT_TIMEOUT_S * 1000
    )
