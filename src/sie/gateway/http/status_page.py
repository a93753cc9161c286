"""The gateway's operator pages (seed 000 §14): `GET /` (the status page), `GET /ws/cluster-status` (a cluster
snapshot about every second, which the page draws), `GET /openapi.json` and `GET /docs` (the description of the
public routes). The two HTML files ship in the package (sie/gateway/http/static) and load nothing from elsewhere.
"""

from __future__ import annotations

import asyncio
import importlib.resources
from typing import Final

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from sie.gateway.cluster_status import ClusterStatus
from sie.gateway.http.headers import VERSION_HEADERS
from sie.gateway.http.openapi import openapi_document
from sie.gateway.http.shutdown import ServingState

PUSH_INTERVAL_S: Final = 1.0
# WebSocket close code for a server going away (RFC 6455 §7.4.1): the gateway is draining.
GOING_AWAY: Final = 1001
# Everything the pages need is inline; they may talk back to this origin only (the websocket, the JSON).
PAGE_HEADERS: Final = {
    **VERSION_HEADERS,
    "content-security-policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data:; connect-src 'self'",
    "cache-control": "no-cache",
}


def _static_page(name: str) -> bytes:
    return importlib.resources.files("sie.gateway.http").joinpath("static", name).read_bytes()


class StatusPages:
    """Handlers of the four routes; the OpenAPI document is built from the app's routes on first request."""

    def __init__(self, cluster: ClusterStatus, serving: ServingState) -> None:
        self._cluster = cluster
        self._serving = serving
        self._status_html = _static_page("status.html")
        self._docs_html = _static_page("docs.html")
        self._openapi: bytes | None = None

    async def status_page(self, request: Request) -> Response:
        return Response(self._status_html, media_type="text/html", headers=PAGE_HEADERS)

    async def docs(self, request: Request) -> Response:
        return Response(self._docs_html, media_type="text/html", headers=PAGE_HEADERS)

    async def openapi(self, request: Request) -> Response:
        if self._openapi is None:  # routes are fixed once the app serves
            routes = [
                (path, getattr(route, "methods", None))
                for route in request.app.routes
                if (path := getattr(route, "path", None))
            ]
            self._openapi = orjson.dumps(openapi_document(routes))
        return Response(self._openapi, media_type="application/json", headers=VERSION_HEADERS)

    async def cluster_status(self, websocket: WebSocket) -> None:
        """Push a snapshot now and every PUSH_INTERVAL_S until the client leaves or the gateway drains."""
        await websocket.accept()
        closed = asyncio.ensure_future(_until_closed(websocket))
        try:
            while not closed.done() and not self._serving.draining:
                snapshot = await self._cluster.snapshot()
                await websocket.send_text(orjson.dumps(snapshot).decode())
                await asyncio.wait({closed}, timeout=PUSH_INTERVAL_S)
            if not closed.done():
                await websocket.close(GOING_AWAY)
        except WebSocketDisconnect:
            pass  # the client left while a snapshot was on its way
        finally:
            closed.cancel()
            await asyncio.gather(closed, return_exceptions=True)


async def _until_closed(websocket: WebSocket) -> None:
    """Read (and ignore) what the client sends until it closes the connection."""
    while (await websocket.receive())["type"] != "websocket.disconnect":
        pass


def status_routes(pages: StatusPages) -> list[BaseRoute]:
    return [
        Route("/", pages.status_page, methods=["GET"]),
        WebSocketRoute("/ws/cluster-status", pages.cluster_status),
        Route("/openapi.json", pages.openapi, methods=["GET"]),
        Route("/docs", pages.docs, methods=["GET"]),
    ]
