"""Logging (seed 000 §15). Metrics and tracing settings join this group with the telemetry they switch."""

from __future__ import annotations

import attrs

from sie.settings._parsers import boolean, choice
from sie.settings._spec import ROLES, Env, setting


@attrs.frozen
class TelemetrySettings:
    """Log format and level."""

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
    log_json: bool = setting(
        Env(
            "SIE_LOG_JSON",
            boolean(),
            "Write logs as one JSON object per line.",
            flag="--json-logs",
            roles=ROLES,
            read_by=("sie.telemetry.logs",),
        ),
        False,
    )
