"""The access log: exactly one line per HTTP request on the `sie.access` logger, written by a pure ASGI middleware
that the gateway and the config service install outermost (the servers' own access logs are off).

A line says who asked (client address), what (method, path), the model and the number of items, the gateway's
request id, the status and the time taken. The middleware sees the wire; the request path adds what only it
knows (the model named in a body, the item count, the request id) with `note_request`, which writes into the
current request's record through a context variable, so the domain code passes nothing around and imports no
web framework. Bodies are never read here: no texts, no vectors.
"""

from __future__ import annotations

import asyncio
import logging
import string
import time
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from typing import Any, Final
from urllib.parse import quote

import attrs

from sie.telemetry.logs import log_fields

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ACCESS_LOGGER: Final = "sie.access"
# Orchestrator probes and metric scrapes arrive every few seconds: their lines go at DEBUG, not INFO.
QUIET_PATHS: Final = frozenset({"/healthz", "/readyz", "/metrics"})
# nginx's "client closed request": the client left before any answer was sent.
CLIENT_CLOSED: Final = 499
SERVER_ERROR: Final = 500
# Caller-chosen values (paths, model names) are cut to this length and percent-escaped, so one line stays one
# line and a hostile name can neither forge another line nor flood the log.
MAX_VALUE_CHARS: Final = 256
_SAFE_CHARACTERS: Final = "".join(c for c in string.punctuation if c not in '"\\')
_MISSING: Final = "-"

logger = logging.getLogger(ACCESS_LOGGER)


@attrs.define(slots=True)
class AccessRecord:
    """What the request path noted about the request being served (None: not known)."""

    request_id: str | None = None
    model: str | None = None
    items: int | None = None


_current: ContextVar[AccessRecord | None] = ContextVar("sie_access_record", default=None)


def note_request(*, request_id: str | None = None, model: str | None = None, items: int | None = None) -> None:
    """Add what is known about the request being served to its access line; a no-op outside a request."""
    record = _current.get()
    if record is None:
        return
    if request_id is not None:
        record.request_id = request_id
    if model is not None:
        record.model = model
    if items is not None:
        record.items = items


class AccessLogMiddleware:
    """Logs each HTTP request once it is answered (or has failed); other scopes pass through untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = AccessRecord()
        token = _current.set(record)
        started = time.perf_counter()
        status = 0

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        except asyncio.CancelledError:
            status = status or CLIENT_CLOSED
            raise
        except Exception:
            status = status or SERVER_ERROR
            raise
        finally:
            _current.reset(token)
            log_access(scope, record, status, time.perf_counter() - started)


def log_access(scope: Scope, record: AccessRecord, status: int, seconds: float) -> None:
    """Write the access line of one answered request (DEBUG for probes and scrapes, INFO otherwise)."""
    level = logging.DEBUG if scope.get("path") in QUIET_PATHS else logging.INFO
    if not logger.isEnabledFor(level):
        return
    fields = access_fields(scope, record, status, seconds)
    logger.log(
        level,
        '%s "%s %s" %d %.1fms request_id=%s model=%s items=%s',
        fields["client"], fields["method"], fields["path"], status, fields["duration_ms"],
        fields["request_id"] or _MISSING, fields["model"] or _MISSING,
        _MISSING if fields["items"] is None else fields["items"],
        extra=log_fields(event="access", **fields),
    )  # fmt: skip


def access_fields(scope: Scope, record: AccessRecord, status: int, seconds: float) -> dict[str, Any]:
    """The fields of one access line; caller-chosen strings are escaped (see MAX_VALUE_CHARS)."""
    params = scope.get("path_params") or {}
    model = record.model or params.get("model") or params.get("model_id")
    return {
        "request_id": _escaped(record.request_id),
        "method": _escaped(scope.get("method")),
        "path": _escaped(_request_path(scope)),
        "model": _escaped(model if isinstance(model, str) else None),
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
    return quote(value[:MAX_VALUE_CHARS], safe=_SAFE_CHARACTERS)
