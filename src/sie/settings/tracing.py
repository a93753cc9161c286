"""Tracing (seed 000 §13 "Tracing", §15.1): whether spans are exported, where to (the traces-specific OTLP endpoint;
the generic OTEL_EXPORTER_OTLP_ENDPOINT, the service name and resource attributes are the telemetry group's), and
what share of new traces is recorded.
"""

from __future__ import annotations

import attrs

from sie.settings._parsers import boolean, choice, http_url, number
from sie.settings._spec import Env, setting

# The OpenTelemetry spec's sampler names this process builds (OTEL_TRACES_SAMPLER).
SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
            "parentbased_traceidratio")  # fmt: skip

# The roles that serve inference open spans; the config service does not.
_TRACING_ROLES = ("gateway", "sidecar", "worker", "all")
_TRACING_READERS = ("sie.telemetry.tracing",)


@attrs.frozen
class TracingSettings:
    """Span export over OTLP/HTTP and head sampling."""

    enabled: bool = setting(
        Env(
            "SIE_TRACING_ENABLED",
            boolean(),
            "Export spans of inference requests over OTLP/HTTP to OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or "
            "OTEL_EXPORTER_OTLP_ENDPOINT (one of them is needed too). Off or on, a caller's W3C `traceparent` "
            "travels with its work items to the worker.",
            flag="--tracing",
            roles=_TRACING_ROLES,
            read_by=_TRACING_READERS,
        ),
        False,
    )
    sample_ratio: float = setting(
        Env(
            "SIE_TRACING_SAMPLE_RATIO",
            number(maximum=1.0),
            "Share of new traces recorded (head sampling by trace id); a caller's `traceparent` decides for its "
            "own trace (parent-based).",
            roles=_TRACING_ROLES,
            read_by=_TRACING_READERS,
        ),
        1.0,
    )
    sampler: str = setting(
        Env(
            "OTEL_TRACES_SAMPLER",
            choice(*SAMPLERS),
            "Which new traces are recorded, as the OpenTelemetry spec names the samplers: `always_on`, `always_off`, "
            "`traceidratio` (a share of trace ids), and the `parentbased_` forms of each, where a caller's "
            "`traceparent` decides for its own trace. The ratio is OTEL_TRACES_SAMPLER_ARG, else "
            "SIE_TRACING_SAMPLE_RATIO.",
            flag=None,
            roles=_TRACING_ROLES,
            read_by=_TRACING_READERS,
        ),
        "parentbased_traceidratio",
    )
    sampler_arg: float | None = setting(
        Env(
            "OTEL_TRACES_SAMPLER_ARG",
            number(maximum=1.0),
            "The ratio of the `traceidratio` samplers (0 to 1); wins over SIE_TRACING_SAMPLE_RATIO.",
            flag=None,
            roles=_TRACING_ROLES,
            read_by=_TRACING_READERS,
        ),
        None,
    )
    traces_endpoint: str | None = setting(
        Env(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            http_url(),
            "Full OTLP/HTTP URL spans are posted to (protobuf), used as given; wins over OTEL_EXPORTER_OTLP_ENDPOINT "
            "(spans then go to `{url}/v1/traces`).",
            flag=None,
            roles=_TRACING_ROLES,
            read_by=_TRACING_READERS,
        ),
        None,
    )
