"""Graceful shutdown: a pure ASGI middleware that counts in-flight requests and, once draining, answers new
ones 503 SHUTTING_DOWN with Retry-After while the in-flight ones finish; probes pass through untouched.

ServingState is what the role file drives: `begin_shutdown()` on SIGTERM, then `await drain(deadline)`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from sie.gateway.errors import ShuttingDownError
from sie.gateway.http.replies import send_error_reply

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PROBE_PATHS: Final = frozenset({"/healthz", "/readyz", "/health"})


class ServingState:
    """Whether the gateway is serving, and how many requests are in flight."""

    def __init__(self) -> None:
        self.started = False
        self.draining = False
        self.in_flight = 0
        self._idle: asyncio.Event | None = None

    @property
    def ready(self) -> bool:
        """`/readyz`: serving and not draining."""
        return self.started and not self.draining

    def begin_shutdown(self) -> None:
        """Refuse new requests from now on; in-flight ones continue."""
        self.draining = True

    async def drain(self, timeout_s: float) -> bool:
        """Wait until no request is in flight; False if some still were after `timeout_s`."""
        self.begin_shutdown()
        if self.in_flight == 0:
            return True
        self._idle = self._idle or asyncio.Event()
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def enter(self) -> None:
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0 and self._idle is not None:
            self._idle.set()


class ShutdownMiddleware:
    """Counts requests through `serving` and turns new ones away while it drains."""

    def __init__(self, app: ASGIApp, serving: ServingState, exempt_paths: frozenset[str] = PROBE_PATHS) -> None:
        self.app = app
        self._serving = serving
        self._exempt = exempt_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._exempt:
            await self.app(scope, receive, send)
            return
        if self._serving.draining:
            error = ShuttingDownError("The gateway is shutting down; retry the request")
            await send_error_reply(error, scope["path"], send)
            return
        self._serving.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self._serving.leave()
