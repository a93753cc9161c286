"""Logging, metrics and tracing switches and the OTLP endpoints (seed 000 §13 "Tracing", §15; seed 001).

The OpenTelemetry SDK still reads its own `OTEL_*` variables (sampler, headers, resource attributes);
only the ones our code decides on are read here.
"""

from __future__ import annotations

import attrs

from sie.settings._parsers import boolean, choice, text
from sie.settings._spec import Env, setting


@attrs.frozen
class TelemetrySettings:
    """Log format and level, and whether metrics and traces are recorded and exported."""

    log_level: str = setting(
        Env(
            "SIE_LOG_LEVEL",
            choice("debug", "info", "warning", "error", "critical", aliases={"warn": "warning"}),
            "Log verbosity.",
        ),
        "info",
    )
    log_json: bool = setting(
        Env("SIE_LOG_JSON", boolean(), "Write logs as one JSON object per line.", flag="--json-logs"),
        False,
    )
    metrics_enabled: bool = setting(
        Env(
            "SIE_METRICS_ENABLED",
            boolean(),
            "Record metrics (Prometheus exposition; OTLP push too when an endpoint is set).",
            flag="--metrics",
        ),
        True,
    )
    tracing_enabled: bool = setting(
        Env(
            "SIE_TRACING_ENABLED",
            boolean(),
            "Export spans; also needs an OTLP endpoint. Trace context propagates either way.",
            flag="--tracing",
        ),
        False,
    )
    service_name: str | None = setting(
        Env(
            "OTEL_SERVICE_NAME",
            text(),
            "Service name in telemetry.",
            flag="--service-name",
            shown_default="`sie-{role}`",
        ),
        None,
    )
    otlp_endpoint: str | None = setting(
        Env("OTEL_EXPORTER_OTLP_ENDPOINT", text(), "Generic OTLP endpoint.", flag="--otlp-endpoint"),
        None,
    )
    otlp_traces_endpoint: str | None = setting(
        Env(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            text(),
            "OTLP endpoint for traces; wins over the generic one.",
            flag="--otlp-traces-endpoint",
        ),
        None,
    )
    otlp_metrics_endpoint: str | None = setting(
        Env(
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            text(),
            "OTLP endpoint for metrics; wins over the generic one.",
            flag="--otlp-metrics-endpoint",
        ),
        None,
    )
