"""Serving a framework-free async handler (method, path, query, body -> reply or None) from a starlette app: an
ASGI adapter and the routes that mount it under given path prefixes. Generic: it knows no handler's paths or
envelopes (the placement control surface is one such handler)."""

from __future__ import annotations

from collections.abc import Iterable

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from sie.http.bodies import read_body
from sie.http.errors import BodyIncompleteError, BodyTooLargeError
from sie.http.plain import MAX_BODY_BYTES, PlainHandler


class PlainHandlerApp:
    """The ASGI app serving one plain handler; a path the handler declines answers a plain 404."""

    def __init__(self, handle: PlainHandler, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self._handle = handle
        self._max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        response = await self._response(request)
        await response(scope, receive, send)

    async def _response(self, request: Request) -> Response:
        try:
            body = await read_body(request, self._max_body_bytes)
        except BodyTooLargeError as exc:
            return PlainTextResponse(exc.message, 413)
        except BodyIncompleteError as exc:
            return PlainTextResponse(str(exc), 400)  # nobody reads it: the client is gone
        method = "GET" if request.method == "HEAD" else request.method
        reply = await self._handle(method, request.scope["path"], dict(request.query_params), body)
        if reply is None:
            return PlainTextResponse("not found", 404)
        return Response(reply.body, reply.status, headers={"content-type": reply.content_type})


def plain_handler_app(handle: PlainHandler, max_body_bytes: int = MAX_BODY_BYTES) -> PlainHandlerApp:
    """An ASGI app that serves `handle`."""
    return PlainHandlerApp(handle, max_body_bytes)


def plain_handler_routes(handle: PlainHandler, prefixes: Iterable[str]) -> list[Route]:
    """Starlette routes sending each prefix and everything under it (`prefix/...`, any method) to `handle`."""
    app = plain_handler_app(handle)
    routes = []
    for prefix in prefixes:
        # An ASGI class endpoint (not a function) keeps every method: the handler answers 405 itself.
        routes.append(Route(prefix, app, name=f"plain:{prefix}"))
        routes.append(Route(f"{prefix}/{{rest:path}}", app, name=f"plain:{prefix}/"))
    return routes


__all__ = ["PlainHandlerApp", "plain_handler_app", "plain_handler_routes"]
