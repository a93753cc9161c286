"""Process-wide logging from settings: the level, and text or one-JSON-object-per-line output (SIE_LOG_FORMAT).

A log call may carry structured fields with `extra=log_fields(...)`: the JSON format writes them as keys of the
line's object, the text format leaves them out (the message already says them). The fields hold ids, counts,
sizes and durations, never request bodies, texts or vectors.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Final

import orjson

from sie.settings import TelemetrySettings

# The record attribute `log_fields` sets; `extra` keys become record attributes in the logging module.
FIELDS_ATTRIBUTE: Final = "sie_fields"
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Held at WARNING whatever SIE_LOG_LEVEL says: the servers' own access logs (each request has exactly one line,
# sie.access's), and hpack, whose DEBUG lines print decoded HTTP/2 headers, bearer tokens included.
QUIET_LOGGERS: Final = ("hypercorn.access", "uvicorn.access", "hpack")
# httpx says every request it sends at INFO: the config polls and pool-status reads, every few seconds. Shown only
# with SIE_LOG_LEVEL=debug.
CLIENT_LOGGERS: Final = ("httpx",)


def log_fields(**fields: Any) -> dict[str, Any]:
    """The `extra=` argument of a log call whose JSON line carries `fields` as keys."""
    return {FIELDS_ATTRIBUTE: fields}


class JsonFormatter(logging.Formatter):
    """`{"ts","level","logger","message"[,fields...][,"exc"]}` per line, for log collectors."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in getattr(record, FIELDS_ATTRIBUTE, {}).items():
            entry.setdefault(key, value)  # a field never hides the line's own keys
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure_logging(telemetry: TelemetrySettings) -> None:
    """Install one stderr handler on the root logger with the configured level and format."""
    handler = logging.StreamHandler(sys.stderr)
    if telemetry.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # Neither format names a thread or a process: a record need not look them up (the access log writes one a
    # request).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root.setLevel(telemetry.log_level.upper())
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING)
