"""Logging (seed 000 §15). Metrics and tracing settings join this group with the telemetry they switch."""

from __future__ import annotations

import attrs

from sie.settings._parsers import Parser, boolean, choice
from sie.settings._spec import ROLES, Env, setting

LOG_FORMATS = ("text", "json")


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
