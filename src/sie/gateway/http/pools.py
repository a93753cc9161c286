"""The pools API (seed 000 §14, §16.3; the public SDK's `create_pool`/`get_pool`/`delete_pool`), JSON in and out:

    GET    /v1/pools                 {"pools": [Pool, ...]}: `default`, the static queue pools, then the live leases
    POST   /v1/pools                 create a leased pool → 201 Pool; a live one of that name is updated and its
                                     lease renewed → 200 Pool (the public SDK re-POSTs to update); 400 INVALID_POOL
    GET    /v1/pools/{name}          one Pool (404 POOL_NOT_FOUND)
    DELETE /v1/pools/{name}          {"deleted": name} (403 POOL_PROTECTED for `default` and static queue pools)
    POST   /v1/pools/{name}/renew    extend the lease by its ttl_seconds → Pool

Mutations are admin routes (gateway/http/auth.py); reads take an inference token in token mode. Errors go through
replies.py. A store the broker cannot reach answers 503 QUEUE_UNAVAILABLE.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sie.gateway.errors import InvalidRequestError
from sie.gateway.http.edge import JSON_MEDIA_TYPE, endpoint, json_response
from sie.gateway.http.headers import VERSION_HEADERS
from sie.gateway.http.replies import Surface
from sie.gateway.pools import PoolDirectory
from sie.http.bodies import read_body
from sie.wire import DecodeError, dumps_json, loads_json

MAX_POOL_BODY_BYTES: Final = 64 * 1024


class PoolHandlers:
    """Thin handlers: parse the path and body, call the directory, render JSON."""

    def __init__(self, directory: PoolDirectory, clock: Callable[[], float] = time.time) -> None:
        self._directory = directory
        self._clock = clock

    @endpoint(Surface.NATIVE)
    async def list_pools(self, request: Request) -> Response:
        now = self._clock()
        return json_response({"pools": [pool.to_json(now) for pool in self._directory.pools()]})

    @endpoint(Surface.NATIVE)
    async def create(self, request: Request) -> Response:
        raw = await read_body(request, MAX_POOL_BODY_BYTES)
        try:
            body: Any = loads_json(raw)
        except DecodeError as exc:
            raise InvalidRequestError(f"Invalid JSON: {exc}", code="parse_error") from exc
        if not isinstance(body, dict):
            raise InvalidRequestError("The body must be a JSON object: {name, gpus, ...}")
        pool, new = await self._directory.create(body)
        content = dumps_json(pool.to_json(self._clock()))
        return Response(content, status_code=201 if new else 200, media_type=JSON_MEDIA_TYPE, headers=VERSION_HEADERS)

    @endpoint(Surface.NATIVE)
    async def get(self, request: Request) -> Response:
        pool = await self._directory.get(request.path_params["name"])
        return json_response(pool.to_json(self._clock()))

    @endpoint(Surface.NATIVE)
    async def delete(self, request: Request) -> Response:
        name = request.path_params["name"]
        await self._directory.delete(name)
        return json_response({"deleted": name.strip().lower()})

    @endpoint(Surface.NATIVE)
    async def renew(self, request: Request) -> Response:
        pool = await self._directory.renew(request.path_params["name"])
        return json_response(pool.to_json(self._clock()))


def pool_routes(directory: PoolDirectory | None) -> list[Route]:
    """The `/v1/pools` routes over `directory`; none when the gateway has no pools."""
    if directory is None:
        return []
    handlers = PoolHandlers(directory)
    return [
        Route("/v1/pools", handlers.list_pools, methods=["GET"]),
        Route("/v1/pools", handlers.create, methods=["POST"]),
        Route("/v1/pools/{name}", handlers.get, methods=["GET"]),
        Route("/v1/pools/{name}", handlers.delete, methods=["DELETE"]),
        Route("/v1/pools/{name}/renew", handlers.renew, methods=["POST"]),
    ]
