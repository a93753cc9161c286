"""Where telemetry goes besides `/metrics`: the resource that names this process (OTEL_SERVICE_NAME,
OTEL_RESOURCE_ATTRIBUTES) and the OTLP/HTTP protobuf push of metrics (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, every OTEL_METRIC_EXPORT_INTERVAL ms). Values come from the settings object,
never from the environment: the SDK's own environment lookups are overridden by explicit arguments.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from typing import Final

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

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


def otlp_metric_reader(settings: TelemetrySettings) -> PeriodicExportingMetricReader | None:
    """A reader pushing every instrument over OTLP/HTTP protobuf, or None when no endpoint is set."""
    endpoint = metrics_endpoint(settings)
    if endpoint is None:
        return None
    exporter = OTLPMetricExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_S)
    interval_ms = settings.otlp_metric_export_interval_ms
    return PeriodicExportingMetricReader(
        exporter, export_interval_millis=interval_ms, export_timeout_millis=EXPORT_TIMEOUT_S * 1000
    )
