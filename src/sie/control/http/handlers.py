"""HTTP handlers of the config service (starlette): each checks access, decodes the request, calls one
domain function and encodes the answer. Errors become envelopes through `replies.error_reply` only.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, Final

import attrs
from starlette.requests import Request
from starlette.responses import Response

from sie.catalog import CatalogError, validate_model_id
from sie.control import views
from sie.control.auth import Access, AccessPolicy
from sie.control.documents import parse_put_document, parse_resolve_request, parse_yaml_document
from sie.control.errors import ControlError, RegistryUnavailableError
from sie.control.http.replies import error_reply
from sie.control.idempotency import IdempotencyCache, post_fingerprint, put_fingerprint
from sie.control.registry import ModelRegistry
from sie.control.writes import ConfigWriter
from sie.http.bodies import read_body
from sie.http.errors import BodyIncompleteError, BodyTooLargeError
from sie.stores.config_store import ConfigStoreError
from sie.wire import dumps_json

# A model config is a few kilobytes; ruamel's pure-Python parser spends about 20 µs per byte of a dense flow list,
# so this bound also bounds the CPU one write may cost (about 5 s at worst).
MAX_BODY_BYTES: Final = 256 * 1024
YAML_MEDIA_TYPE: Final = "application/x-yaml"
JSON_MEDIA_TYPE: Final = "application/json"
IDEMPOTENCY_HEADER: Final = "idempotency-key"

# A write's cached answer: status and the exact body bytes, replayed verbatim.
Answer = tuple[int, bytes]
Handler = Callable[[Any, Request], Awaitable[Response]]


def json_response(body: Any, status: int = 200) -> Response:
    return Response(dumps_json(body), status_code=status, media_type=JSON_MEDIA_TYPE)


def yaml_response(text: str) -> Response:
    return Response(text, media_type=YAML_MEDIA_TYPE)


def guarded(access: Access) -> Callable[[Handler], Handler]:
    """Check the token for `access`, and turn domain errors into their envelopes."""

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def wrapper(self: ControlHandlers, request: Request) -> Response:
            try:
                self.policy.check(request.headers.get("authorization"), access)
                return await handler(self, request)
            except (ControlError, CatalogError, ConfigStoreError, BodyTooLargeError, BodyIncompleteError) as exc:
                reply = error_reply(exc)
                return json_response(reply.body, reply.status)

        return wrapper

    return decorate


def _answer(status: int, outcome: Any) -> Answer:
    return status, dumps_json(attrs.asdict(outcome))


class ControlHandlers:
    """The routes' handlers over one writer, registry, access policy and idempotency cache."""

    def __init__(
        self, writer: ConfigWriter, registry: ModelRegistry, policy: AccessPolicy, max_body_bytes: int = MAX_BODY_BYTES
    ) -> None:
        self.writer = writer
        self.registry = registry
        self.policy = policy
        self.max_body_bytes = max_body_bytes
        self.idempotency: IdempotencyCache[Answer] = IdempotencyCache()

    async def _idempotent(
        self, request: Request, fingerprint: str, execute: Callable[..., Awaitable[Answer]]
    ) -> Response:
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if key:
            status, body = await self.idempotency.run(key, fingerprint, execute)
        else:
            status, body = await execute(None)
        return Response(body, status_code=status, media_type=JSON_MEDIA_TYPE)

    @guarded(Access.WRITE)
    async def add_model(self, request: Request) -> Response:
        body = await read_body(request, self.max_body_bytes)

        async def execute(enter_commit: Callable[[], None] | None) -> Answer:
            document = await asyncio.to_thread(parse_yaml_document, body)
            outcome = await self.writer.add_model(document, on_commit=enter_commit)
            return _answer(201 if outcome.created else 200, outcome)

        return await self._idempotent(request, post_fingerprint(body), execute)

    @guarded(Access.WRITE)
    async def replace_model(self, request: Request) -> Response:
        model_id = request.path_params["model_id"]
        body = await read_body(request, self.max_body_bytes)

        async def execute(enter_commit: Callable[[], None] | None) -> Answer:
            document = await asyncio.to_thread(parse_put_document, model_id, body)
            return _answer(200, await self.writer.replace_model(document, on_commit=enter_commit))

        return await self._idempotent(request, put_fingerprint(model_id, body), execute)

    @guarded(Access.WRITE)
    async def delete_model(self, request: Request) -> Response:
        model_id = request.path_params["model_id"]
        validate_model_id(model_id)
        return json_response(attrs.asdict(await self.writer.delete_model(model_id)))

    @guarded(Access.READ)
    async def list_models(self, request: Request) -> Response:
        return json_response(views.list_models(self.registry.state))

    @guarded(Access.READ)
    async def get_model(self, request: Request) -> Response:
        return yaml_response(views.model_yaml(self.registry.state, request.path_params["model_id"]))

    @guarded(Access.READ)
    async def list_bundles(self, request: Request) -> Response:
        return json_response(views.list_bundles(self.registry.state.catalog))

    @guarded(Access.READ)
    async def get_bundle(self, request: Request) -> Response:
        return yaml_response(views.bundle_yaml(self.registry.state.catalog, request.path_params["bundle_id"]))

    @guarded(Access.READ)
    async def resolve(self, request: Request) -> Response:
        spec, bundle = parse_resolve_request(await read_body(request, self.max_body_bytes))
        return json_response(views.resolve(self.registry.state.catalog, spec, bundle))

    @guarded(Access.READ)
    async def epoch(self, request: Request) -> Response:
        state = self.registry.state if self.registry.available else None
        return json_response(views.epoch_view(self.writer.epoch, state))

    @guarded(Access.EXPORT)
    async def export(self, request: Request) -> Response:
        return json_response(await self.writer.export())

    async def healthz(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        if not self.registry.available:
            reply = error_reply(RegistryUnavailableError(f"Model registry is unavailable: {self.registry.load_error}"))
            return json_response(reply.body, reply.status)
        return json_response({"status": "ready"})
