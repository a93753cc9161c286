"""Logging (seed 000 §15). Metrics and tracing settings join this group with the telemetry they switch."""

from __future__ import annotations

from urllib.parse import unquote

import attrs

from sie.settings._parsers import Parser, boolean, choice, http_url, integer, text
from sie.settings._spec import ROLES, Env, setting

LOG_FORMATS = ("text", "json")
# How telemetry is pushed to a collector (OTEL_EXPORTER_OTLP_PROTOCOL; the spec's `http/json` is not offered).
OTLP_PROTOCOLS = ("http/protobuf", "grpc")


def _resource_attributes() -> Parser:
    """`key=value,key=value` (OTEL_RESOURCE_ATTRIBUTES), values percent-decoded, as ordered pairs."""

    def convert(raw: str) -> tuple[tuple[str, str], ...]:
        pairs = []
        for part in (piece.strip() for piece in raw.split(",")):
            if not part:
                continue
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"has an entry {part!r} that is not key=value; expected e.g. service.namespace=sie")
            pairs.append((key.strip(), unquote(value.strip())))
        return tuple(pairs)

    def render(value: tuple[tuple[str, str], ...]) -> str:
        return ",".join(f"{key}={item}" for key, item in value) if value else "empty"

    return Parser("list of key=value", convert, render)


def _log_format() -> Parser:
    """`text` or `json`, any case; the boolean spellings of the deprecated SIE_LOG_JSON alias map onto them."""
    legacy = boolean()

    def convert(raw: str) -> str:
        if raw.lower() in LOG_FORMATS:
            return raw.lower()
        try:
            return "json" if legacy.convert(raw) else "text"
        except ValueError:
            raise ValueError(f"is not allowed; expected one of: {', '.join(LOG_FORMATS)}") from None

    return Parser(" | ".join(LOG_FORMATS), convert)


@attrs.frozen
class TelemetrySettings:
    """Log format and level; metrics (recording, `/metrics`) and their OTLP push with the resource naming it."""

    log_level: str = setting(
        Env(
            "SIE_LOG_LEVEL",
            choice("debug", "info", "warning", "error", "critical", aliases={"warn": "warning"}),
            "Log verbosity.",
            roles=ROLES,
            read_by=("sie.telemetry.logs",),
        ),
        "info",
    )
    log_format: str = setting(
        Env(
            "SIE_LOG_FORMAT",
            _log_format(),
            "Log lines as text, or as one JSON object per line whose keys hold the fields of access and model "
            "lines. The deprecated SIE_LOG_JSON=true|false means json|text.",
            aliases=("SIE_LOG_JSON",),
            roles=ROLES,
            read_by=("sie.telemetry.logs",),
        ),
        "text",
    )
    metrics_enabled: bool = setting(
        Env(
            "SIE_METRICS_ENABLED",
            boolean(),
            "Record metrics, serve them on `/metrics` and push them over OTLP when an endpoint is set; false "
            "turns all three off.",
            roles=ROLES,
            read_by=("sie.telemetry.metrics",),
        ),
        True,
    )
    otlp_endpoint: str | None = setting(
        Env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            http_url(),
            "Base URL of an OTLP collector: metrics are pushed to `{url}/v1/metrics` over OTLP/HTTP (protobuf), or "
            "to the URL itself over gRPC (OTEL_EXPORTER_OTLP_PROTOCOL). Unset: no push.",
            flag=None,
            roles=ROLES,
            read_by=("sie.telemetry.export",),
        ),
        None,
    )
    otlp_protocol: str = setting(
        Env(
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            choice(*OTLP_PROTOCOLS),
            "How metrics and spans are pushed: `http/protobuf` (POSTs to `{url}/v1/metrics` and `{url}/v1/traces`) "
            "or `grpc` (the OTLP gRPC services at the endpoint itself, e.g. `http://collector:4317`; needs the "
            "`sie[grpc]` extra, which the container images install).",
            flag=None,
            roles=ROLES,
            read_by=("sie.telemetry.export", "sie.telemetry.tracing"),
        ),
        "http/protobuf",
    )
    otlp_metrics_endpoint: str | None = setting(
        Env(
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            http_url(),
            "Full OTLP/HTTP URL metrics are pushed to, used as given; wins over OTEL_EXPORTER_OTLP_ENDPOINT.",
            flag=None,
            roles=ROLES,
            read_by=("sie.telemetry.export",),
        ),
        None,
    )
    otlp_metric_export_interval_ms: int = setting(
        Env(
            "OTEL_METRIC_EXPORT_INTERVAL",
            integer(minimum=100),
            "Milliseconds between two OTLP metric pushes (the last one goes out at shutdown).",
            flag=None,
            roles=ROLES,
            read_by=("sie.telemetry.export",),
        ),
        60000,
    )
    service_name: str | None = setting(
        Env(
            "OTEL_SERVICE_NAME",
            text(),
            "The `service.name` resource attribute of pushed telemetry. Unset: `sie-{role}`.",
            flag=None,
            shown_default="sie-{role}",
            roles=ROLES,
            read_by=("sie.telemetry.export",),
        ),
        None,
    )
    resource_attributes: tuple[tuple[str, str], ...] = setting(
        Env(
            "OTEL_RESOURCE_ATTRIBUTES",
            _resource_attributes(),
            "More resource attributes of pushed telemetry, `key=value,key=value` (e.g. "
            "`deployment.environment=prod,cloud.region=eu-west-1`).",
            flag=None,
            roles=ROLES,
            read_by=("sie.telemetry.export",),
        ),
        (),
    )
