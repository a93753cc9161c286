"""Result collection: one app-wide subscription on `_INBOX.{router_id}.>` fills the slots of pending requests.

A request registers N slots under its request id and waits until all are filled or its timeout passes.
Results for unknown ids, out-of-range slots or already-filled slots are dropped (delivery is at-least-once).
A result too large for one broker message arrives as result_chunk_v1 envelopes, reassembled per request within
the gateway-wide chunk budget (result_chunks.py); an invalid transfer fails the request at once with the static
transport_failure. The entry leaves the table on completion, timeout, publish failure or client disconnect:
`expect` owns it, and on leaving releases its chunk reservations and runs its close hooks (payload cleanup).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Self

from sie.catalog.names import inbox_wildcard
from sie.gateway.errors import GatewayTimeoutError, QueueUnavailableError, TransportFailureError
from sie.gateway.result_chunks import ChunkBudget, ChunkTransferError, ResultReassembly
from sie.transport.base import MessageBus, ResultMessage, Subscription
from sie.wire.queue import ResultChunkV1, WorkResult

logger = logging.getLogger(__name__)


class PendingRequest:
    """The result slots of one request, in item order."""

    __slots__ = ("request_id", "results", "missing", "_done", "_budget", "_chunks", "_close_hooks")

    def __init__(
        self, request_id: str, size: int, done: asyncio.Future[None], budget: ChunkBudget | None = None
    ) -> None:
        self.request_id = request_id
        self.results: list[WorkResult | None] = [None] * size
        self.missing = size
        self._done = done
        self._budget = budget
        self._chunks: ResultReassembly | None = None  # made on the first chunk: most requests never get one
        self._close_hooks: list[Callable[[], None]] = []

    def fill(self, result: WorkResult) -> None:
        """Store a result in its slot; a duplicate or out-of-range index is ignored."""
        index = result.item_index
        if not 0 <= index < len(self.results) or self.results[index] is not None:
            return
        self.results[index] = result
        self.missing -= 1
        if self._chunks is not None:
            self._chunks.forget(index)
        if self.missing == 0 and not self._done.done():
            self._done.set_result(None)

    def add_chunk(self, chunk: ResultChunkV1) -> None:
        """Take one result_chunk_v1 envelope; its item's slot is filled once the transfer is complete and
        verified. An invalid transfer fails the request with the static transport_failure."""
        index = chunk.item_index
        if self._done.done() or (0 <= index < len(self.results) and self.results[index] is not None):
            return  # answered already (a redelivery's chunks), or nobody waits
        if self._chunks is None:
            self._chunks = ResultReassembly(self.request_id, len(self.results), self._budget or ChunkBudget())
        try:
            result = self._chunks.add(chunk)
        except ChunkTransferError as exc:
            logger.warning("result chunks of %s failed: %s", self.request_id, exc)
            self.fail(TransportFailureError())
            return
        if result is not None:
            self.fill(result)

    def at_close(self, hook: Callable[[], None]) -> None:
        """Call `hook()` once nobody waits for the request any more, whatever its outcome."""
        self._close_hooks.append(hook)

    def fail(self, error: BaseException) -> None:
        """End the wait with `error` (the collector is stopping, or the work was never stored)."""
        if not self._done.done():
            self._done.set_exception(error)

    def close(self) -> None:
        """Nobody waits any more: later results and failures are ignored, chunk reservations are released and
        the close hooks run."""
        if not self._done.done():
            self._done.cancel()
        if self._chunks is not None:
            self._chunks.release()
        hooks, self._close_hooks = self._close_hooks, []
        for hook in hooks:
            hook()

    async def wait(self, timeout_s: float) -> list[WorkResult]:
        """Every slot's result; GatewayTimeoutError when they do not all arrive within `timeout_s`."""
        if self.missing:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._done
            except TimeoutError:
                received = len(self.results) - self.missing
                raise GatewayTimeoutError(
                    f"No worker result within {timeout_s:g}s ({received} of {len(self.results)} items answered)"
                ) from None
        return self.results  # type: ignore[return-value]  # every slot is filled once missing == 0


class Collector:
    """The gateway's inbox: an async context manager holding the one result subscription."""

    def __init__(self, bus: MessageBus, router_id: str, chunk_budget: ChunkBudget | None = None) -> None:
        self._bus = bus
        self._subject = inbox_wildcard(router_id)
        self._pending: dict[str, PendingRequest] = {}
        self.chunk_budget = chunk_budget if chunk_budget is not None else ChunkBudget()
        self._subscription: Subscription | None = None

    async def __aenter__(self) -> Self:
        self._subscription = await self._bus.subscribe_results(self._subject, self._on_result)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            await subscription.unsubscribe()
        for pending in list(self._pending.values()):
            pending.fail(QueueUnavailableError("The gateway stopped before the results arrived"))

    def __len__(self) -> int:
        """Requests waiting for results (tests check it returns to zero: no leaks)."""
        return len(self._pending)

    @contextlib.contextmanager
    def expect(self, request_id: str, size: int) -> Iterator[PendingRequest]:
        """Register `size` slots for `request_id` for the duration of the `with` block."""
        if self._subscription is None:
            raise QueueUnavailableError("The gateway's result subscription is not running")
        pending = PendingRequest(request_id, size, asyncio.get_running_loop().create_future(), self.chunk_budget)
        self._pending[request_id] = pending
        try:
            yield pending
        finally:
            del self._pending[request_id]
            pending.close()

    def _on_result(self, message: ResultMessage) -> None:
        pending = self._pending.get(message.request_id)
        if pending is None:
            return
        if isinstance(message, ResultChunkV1):
            pending.add_chunk(message)
        else:
            pending.fill(message)
