"""A MessageBus that connects in the background (seed 000 §3 step 3.6, §13): the config service starts and
answers reads while its NATS broker is unreachable, refuses writes with 503 meanwhile (publish and flush
raise TransportUnavailable, which the publisher turns into `nats_unavailable`), and starts publishing once
the broker answers, without a restart.

`ReconnectingBus(open_bus)` calls `open_bus()` for a fresh transport (an async context manager) and enters
it in a task started on enter; a failed attempt is retried after a backoff doubling from 0.5 s to 10 s.
Once entered, the transport's own reconnect logic takes over. Exit cancels the task and closes the transport.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import TracebackType
from typing import Any, Self

from sie.transport.base import (
    MessageBus,
    MessageHandler,
    ResultHandler,
    Subscription,
    TransportError,
    TransportUnavailable,
)
from sie.wire.queue import WorkResult

logger = logging.getLogger(__name__)

INITIAL_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0

BusOpener = Callable[[], AbstractAsyncContextManager[MessageBus]]


class ReconnectingBus:
    """Holds no bus until a background task has opened one; until then every call raises TransportUnavailable."""

    def __init__(
        self,
        open_bus: BusOpener,
        *,
        description: str = "NATS",
        initial_backoff_s: float = INITIAL_BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
    ) -> None:
        self._open_bus = open_bus
        self._description = description
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._stack = AsyncExitStack()
        self._bus: MessageBus | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_error = "not connected yet"

    @property
    def connected(self) -> bool:
        """Whether a bus has been opened (it may still be reconnecting on its own)."""
        return self._bus is not None

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._connect(), name=f"connect {self._description}")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # waits without swallowing a cancellation of our own caller
            if not task.cancelled() and task.exception() is not None:
                logger.warning("connecting to %s failed: %s", self._description, task.exception())
        self._bus = None
        await self._stack.aclose()

    async def wait_connected(self) -> None:
        """Return once the bus is open (for tests and callers that would rather wait)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _connect(self) -> None:
        backoff = self._initial_backoff_s
        while True:
            try:
                bus = await self._stack.enter_async_context(self._open_bus())
            except TransportError as exc:
                self._last_error = str(exc)
                logger.warning("%s unreachable, retrying in %.1f s: %s", self._description, backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
                continue
            self._bus = bus
            logger.info("connected to %s; config deltas are published", self._description)
            return

    def _current(self, action: str) -> MessageBus:
        bus = self._bus
        if bus is None:
            raise TransportUnavailable(f"{action}: {self._description} is not connected ({self._last_error})")
        return bus

    # MessageBus

    async def publish_result(self, subject: str, result: WorkResult) -> None:
        await self._current("publish_result").publish_result(subject, result)

    async def subscribe_results(self, subject: str, handler: ResultHandler) -> Subscription:
        return await self._current("subscribe_results").subscribe_results(subject, handler)

    async def publish(self, subject: str, message: Any) -> None:
        await self._current("publish").publish(subject, message)

    async def subscribe(self, subject: str, handler: MessageHandler, message_type: type | None = None) -> Subscription:
        return await self._current("subscribe").subscribe(subject, handler, message_type)

    async def flush(self) -> None:
        await self._current("flush").flush()
