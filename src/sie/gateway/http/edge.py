"""Starlette glue every gateway route shares: the routing headers, the error wrapper that answers each
failure through replies.py, abandoning work when the client leaves, and rendering.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, Final, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from sie.gateway.errors import ClientDisconnectedError
from sie.gateway.http.headers import VERSION_HEADERS, response_headers
from sie.gateway.http.negotiation import JSON_MEDIA_TYPE, render, wants_msgpack
from sie.gateway.http.replies import ErrorReply, Surface, error_reply
from sie.gateway.inference import Served
from sie.gateway.router import LaneHints
from sie.telemetry.tracing import TRACEPARENT, TRACESTATE, TraceHeaders, trace_headers
from sie.wire import dumps_json

T = TypeVar("T")
S = TypeVar("S")
Handler = Callable[Concatenate[S, Request, ...], Awaitable[Response]]


def lane_hints(request: Request) -> LaneHints:
    """`X-SIE-Pool` and `X-SIE-MACHINE-PROFILE` as sent (the router validates them)."""
    headers = request.headers
    return LaneHints(headers.get("x-sie-pool"), headers.get("x-sie-machine-profile"))


def incoming_trace(request: Request) -> TraceHeaders | None:
    """The caller's W3C `traceparent`/`tracestate`, when it sent a valid one (its work continues that trace)."""
    headers = request.headers
    return trace_headers(headers.get(TRACEPARENT), headers.get(TRACESTATE))


def reply_response(reply: ErrorReply) -> Response:
    return Response(reply.content(), status_code=reply.status, headers=reply.headers, media_type=JSON_MEDIA_TYPE)


def endpoint(surface: Surface) -> Callable[[Handler[S]], Handler[S]]:
    """Wrap a handler method so every exception it raises is answered with `surface`'s envelope."""

    def wrap(handler: Handler[S]) -> Handler[S]:
        @functools.wraps(handler)
        async def run(self: S, request: Request, *args: Any) -> Response:
            try:
                return await handler(self, request, *args)
            except Exception as exc:  # noqa: BLE001 - replies.py answers every failure; it logs the unexpected ones
                return reply_response(error_reply(exc, surface))

        return run

    return wrap


# A request still waiting after this long gets a task watching for its client's disconnect; most are
# answered sooner and never pay for one (a task per request costs about a tenth of the gateway's CPU). Half a
# second and not less: a saturated all-in-one server answers 32 concurrent callers in ~0.1 s each, and at 0.05 s
# every one of them paid for a watcher (0.09 ms of event-loop CPU per request, measured); work abandoned sooner
# than this runs anyway, which costs at most this long of one batch slot.
DISCONNECT_WATCH_AFTER_S: Final = 0.5


class _Watch:
    """Once started, cancels the handler's task when the client disconnects, and remembers that it did."""

    __slots__ = ("fired", "request", "task", "watcher")

    def __init__(self, task: asyncio.Task[Any], request: Request) -> None:
        self.task = task
        self.request = request
        self.fired = False
        self.watcher: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.watcher = asyncio.ensure_future(self._watch())

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()

    async def _watch(self) -> None:
        message = await self.request.receive()
        while message["type"] != "http.disconnect":  # body chunks were read by the handler already
            message = await self.request.receive()
        self.fired = True
        self.task.cancel()


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work` (after the body was read); if the client disconnects first, cancel it.

    Cancellation unwinds the collector's `with` block, so the abandoned request leaves no entry behind.
    The work runs in the handler's own task; a watcher task waiting on `receive()` starts only once the
    request has waited DISCONNECT_WATCH_AFTER_S (neither hypercorn nor uvicorn cancels a handler whose client left).
    """
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("until_disconnect must run inside a task; this is a bug")
    watch = _Watch(task, request)
    timer = asyncio.get_running_loop().call_later(DISCONNECT_WATCH_AFTER_S, watch.start)
    try:
        return await work
    except asyncio.CancelledError:
        if watch.fired and task.uncancel() == 0:
            raise ClientDisconnectedError("The client disconnected before the results arrived") from None
        raise
    finally:
        timer.cancel()
        watch.stop()


def served_response(served: Served, accept: str | None, started: float) -> Response:
    """Render a result in the format `accept` negotiates, with timing headers (X-Total-Time from `started`)."""
    content, media_type = render(served.body, wants_msgpack(accept))
    headers = response_headers(served.meta, (time.perf_counter() - started) * 1e3)
    return Response(content, media_type=media_type, headers=headers)


def json_response(body: Any) -> Response:
    """A JSON body with the version headers (operator endpoints)."""
    return Response(dumps_json(body), media_type=JSON_MEDIA_TYPE, headers=VERSION_HEADERS)
