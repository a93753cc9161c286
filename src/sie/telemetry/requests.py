"""Observing HTTP requests: the one pure ASGI middleware that times each request and, once it is answered (or has
failed), hands its outcome to the observers an app was built with: the access log, the request metrics, the
status page's traffic window. One wrapper, one clock pair and one status capture per request, however many
observe it.

The request path adds what only it knows (the model named in a body, the item count, the gateway's request id)
with `note_request`, which writes into the current request's record through a context variable, so the domain
code passes nothing around and imports no web framework. Bodies are never read here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from contextvars import ContextVar
from typing import Any, Final

import attrs

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# nginx's "client closed request": the client left before any answer was sent.
CLIENT_CLOSED: Final = 499
# An app that raised before answering: the server answers 500.
SERVER_ERROR: Final = 500


@attrs.define(slots=True)
class RequestRecord:
    """What the request path noted about the request being served (None: not known)."""

    request_id: str | None = None
    model: str | None = None
    items: int | None = None


# Called once per answered HTTP request with its scope (route and path parameters filled in by the router), what the
# request path noted, the status sent and the seconds from arrival to the last byte. Must be cheap and never raise.
RequestObserver = Callable[[Scope, RequestRecord, int, float], None]

_current: ContextVar[RequestRecord | None] = ContextVar("sie_request_record", default=None)


def note_request(*, request_id: str | None = None, model: str | None = None, items: int | None = None) -> None:
    """Add what is known about the request being served to its record; a no-op outside a request."""
    record = _current.get()
    if record is None:
        return
    if request_id is not None:
        record.request_id = request_id
    if model is not None:
        record.model = model
    if items is not None:
        record.items = items


def noted_model(scope: Scope, record: RequestRecord) -> str | None:
    """The request's model: what the request path noted, else the route's `{model}` (or `{model_id}`) parameter."""
    params = scope.get("path_params") or {}
    model = record.model or params.get("model") or params.get("model_id")
    return model if isinstance(model, str) else None


class Observation:
    """One request observed outside the ASGI middleware (the KServe gRPC service): while it is open `note_request`
    writes into its record; `finish(status)` tells each observer, with `scope` standing in for an HTTP one (`type`,
    `method`, `path`, `route` with its `path` template, `path_params`, `client`)."""

    def __init__(self, scope: Scope, observers: Sequence[RequestObserver]) -> None:
        self._scope = scope
        self._observers = tuple(observers)
        self.record = RequestRecord()
        self._token = _current.set(self.record)
        self._started = time.perf_counter()

    def finish(self, status: int) -> None:
        _current.reset(self._token)
        seconds = time.perf_counter() - self._started
        for observe in self._observers:
            observe(self._scope, self.record, status, seconds)


class ObservedRequests:
    """Times every HTTP request of the app it wraps and tells each observer its outcome; websocket and lifespan
    scopes pass through untouched."""

    def __init__(self, app: ASGIApp, observers: Sequence[RequestObserver]) -> None:
        self.app = app
        self._observers = tuple(observers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._observers:
            await self.app(scope, receive, send)
            return
        record = RequestRecord()
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
            seconds = time.perf_counter() - started
            for observe in self._observers:
                observe(scope, record, status or SERVER_ERROR, seconds)
