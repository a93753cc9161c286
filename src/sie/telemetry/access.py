"""The access log: exactly one line per HTTP request on the `sie.access` logger, written by `log_access`, an
observer of `sie.telemetry.requests.ObservedRequests`, which the gateway and the config service install outermost
(the servers' own access logs are off).

A line says who asked (client address), what (method, path), the model and the number of items, the gateway's
request id, the status and the time taken; the model, items and request id are what the request path noted
(`note_request`). Bodies are never read here: no texts, no vectors.
"""

from __future__ import annotations

import logging
import re
import string
from typing import Any, Final
from urllib.parse import quote

from sie.telemetry.logs import log_fields
from sie.telemetry.requests import RequestRecord, Scope, noted_model

ACCESS_LOGGER: Final = "sie.access"
# Orchestrator probes and metric scrapes arrive every few seconds: their lines go at DEBUG, not INFO.
QUIET_PATHS: Final = frozenset({"/healthz", "/readyz", "/metrics"})
# Caller-chosen values (paths, model names) are cut to this length and percent-escaped, so one line stays one
# line and a hostile name can neither forge another line nor flood the log.
MAX_VALUE_CHARS: Final = 256
_SAFE_CHARACTERS: Final = "".join(c for c in string.punctuation if c not in '"\\')
# What quote() leaves as it is: a value made only of these needs no escaping (the common case, checked in C).
_UNESCAPED: Final = re.compile("[A-Za-z0-9" + re.escape(_SAFE_CHARACTERS) + "]*")
_MISSING: Final = "-"
_ACCESS_FORMAT: Final = '%s "%s %s" %d %.1fms request_id=%s model=%s items=%s'

logger = logging.getLogger(ACCESS_LOGGER)


def log_access(scope: Scope, record: RequestRecord, status: int, seconds: float) -> None:
    """Write the access line of one answered request (DEBUG for probes and scrapes, INFO otherwise)."""
    level = logging.DEBUG if scope.get("path") in QUIET_PATHS else logging.INFO
    if not logger.isEnabledFor(level):
        return
    fields = access_fields(scope, record, status, seconds)
    arguments = (
        fields["client"], fields["method"], fields["path"], status, fields["duration_ms"],
        fields["request_id"] or _MISSING, fields["model"] or _MISSING,
        _MISSING if fields["items"] is None else fields["items"],
    )  # fmt: skip
    # makeRecord + handle is logger.log without its caller lookup (a walk up the stack): every request pays for
    # this line, and its source location would always be this function anyway.
    line = logger.makeRecord(
        ACCESS_LOGGER, level, __file__, 0, _ACCESS_FORMAT, arguments, None, extra=log_fields(event="access", **fields)
    )
    logger.handle(line)


def access_fields(scope: Scope, record: RequestRecord, status: int, seconds: float) -> dict[str, Any]:
    """The fields of one access line; caller-chosen strings are escaped (see MAX_VALUE_CHARS)."""
    model = noted_model(scope, record)
    return {
        "request_id": _escaped(record.request_id),
        "method": _escaped(scope.get("method")),
        "path": _escaped(_request_path(scope)),
        "model": _escaped(model),
        "items": record.items,
        "status": status,
        "duration_ms": round(seconds * 1e3, 2),
        "client": _client(scope.get("client")),
    }


def _request_path(scope: Scope) -> str:
    # The path as the client sent it (still percent-encoded), without the query string: queries can carry secrets.
    raw = scope.get("raw_path")
    if isinstance(raw, bytes):
        return raw.partition(b"?")[0].decode("latin-1")
    return str(scope.get("path", ""))


def _client(client: Any) -> str:
    if not client:
        return _MISSING
    host, port = client[0], client[1] if len(client) > 1 else None
    return _escaped(f"{host}:{port}" if port is not None else str(host)) or _MISSING


def _escaped(value: str | None) -> str | None:
    if value is None:
        return None
    if len(value) <= MAX_VALUE_CHARS and _UNESCAPED.fullmatch(value):
        return value
    return quote(value[:MAX_VALUE_CHARS], safe=_SAFE_CHARACTERS)
