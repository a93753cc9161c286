"""Process-wide logging from settings: level, and plain or one-JSON-object-per-line output."""

from __future__ import annotations

import logging
import sys

import orjson

from sie.settings import TelemetrySettings


class JsonFormatter(logging.Formatter):
    """`{"ts","level","logger","message"[,"exc"]}` per line, for log collectors."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def configure_logging(telemetry: TelemetrySettings) -> None:
    """Install one stderr handler on the root logger with the configured level and format."""
    handler = logging.StreamHandler(sys.stderr)
    if telemetry.log_json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(telemetry.log_level.upper())
    for noisy in ("hypercorn.access",):
        logging.getLogger(noisy).setLevel(logging.WARNING)
