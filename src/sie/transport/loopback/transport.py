"""LoopbackTransport: the in-process Transport for `sie run --role all` and tests (DESIGN.md §4).

Composes one PoolStream per pool with one LoopbackBus and owns their lifecycle: timers and tasks are
created inside the running loop and cancelled on exit. Objects travel by reference, never serialised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

from sie.catalog.names import is_work_worker_subject, lane_filter_subject, work_consumer_name
from sie.settings import StreamSettings
from sie.transport.base import (
    Lane,
    LaneDepth,
    MaxDeliveriesAdvisory,
    MessageHandler,
    NoConsumerError,
    ResultHandler,
    TransportUnavailable,
    WorkerStream,
    pool_of,
)
from sie.transport.loopback.bus import BusSubscription, LoopbackBus
from sie.transport.loopback.dead_letters import LoopbackDeadLetterStore
from sie.transport.loopback.stream import LoopbackLaneConsumer, PoolStream
from sie.wire.queue import WorkItem, WorkResult


class LoopbackTransport:
    """Work queues and pub/sub in one process, with JetStream WorkQueue semantics.

    Use as `async with LoopbackTransport(StreamSettings(...)) as transport:`; every call after exit
    raises TransportUnavailable.
    """

    def __init__(self, settings: StreamSettings | None = None) -> None:
        self.settings = settings if settings is not None else StreamSettings()
        self._bus = LoopbackBus()
        self._streams: dict[str, PoolStream] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._dead_letters = LoopbackDeadLetterStore(self._stream_named)

    async def __aenter__(self) -> Self:
        if self._closed:
            raise TransportUnavailable("this loopback transport was closed; create a new one")
        self._loop = asyncio.get_running_loop()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop every timer, wake blocked fetchers (they raise TransportUnavailable), await pending advisories."""
        if self._closed:
            return
        self._closed = True
        for stream in self._streams.values():
            stream.close()
        self._bus.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # WorkQueue

    async def publish_work(self, subject: str, item: WorkItem) -> None:
        """Queue `item` on its pool stream; raises BackpressureError at `max_msgs` (discard new), and NoConsumerError
        for a worker direct-dispatch subject (in process there is one sidecar and no worker stream)."""
        loop = self._running_loop()
        pool = pool_of(subject)
        if is_work_worker_subject(subject):
            raise NoConsumerError(f"publish to {subject}: no worker direct-dispatch in process; publish on the lane")
        tokens = subject.split(".")
        stream = self._streams.get(pool)
        if stream is None:
            stream = PoolStream(pool, self.settings, loop, self._publish_advisory)
            stream.publish(subject, tokens, item)  # registered only once a publish shows the subject is its own
            self._streams[pool] = stream
        else:
            stream.publish(subject, tokens, item)

    async def submit_work_batch(self, subject: str, items: Sequence[WorkItem]) -> asyncio.Future[None]:
        """Queue the items in order; in memory they are stored once sent, so the future is already done."""
        for item in items:
            await self.publish_work(subject, item)
        stored: asyncio.Future[None] = self._running_loop().create_future()
        stored.set_result(None)
        return stored

    async def consumer(self, lane: Lane) -> LoopbackLaneConsumer:
        """Attach to the lane's durable consumer (created on first use); handles share its messages."""
        stream = self._stream(lane.pool)
        lane_filter = lane_filter_subject(lane.pool, lane.machine_profile, lane.bundle)
        queue = stream.attach(lane_filter, work_consumer_name(lane.pool, lane.machine_profile, lane.bundle))
        return LoopbackLaneConsumer(stream, queue)

    async def worker_consumer(self, lane: Lane, worker_id: str) -> None:
        """None: in process one sidecar serves each lane, so there is no worker direct-dispatch."""
        self._running_loop()

    async def pending(self, pool: str) -> int:
        """Messages in the pool's stream: queued, delayed, or delivered and not yet settled."""
        self._running_loop()
        stream = self._streams.get(pool)
        return 0 if stream is None else len(stream)

    async def has_consumer(self, lane: Lane) -> bool:
        """Whether a consumer was attached to `lane` on this transport."""
        self._running_loop()
        stream = self._streams.get(lane.pool)
        lane_filter = lane_filter_subject(lane.pool, lane.machine_profile, lane.bundle)
        return stream is not None and stream.has_consumer(lane_filter)

    async def lane_depth(self, lane: Lane) -> LaneDepth:
        """Messages of the lane waiting for delivery, and delivered ones not yet settled."""
        self._running_loop()
        stream = self._streams.get(lane.pool)
        lane_filter = lane_filter_subject(lane.pool, lane.machine_profile, lane.bundle)
        return LaneDepth() if stream is None else stream.lane_depth(lane_filter)

    # WorkerStreams

    async def worker_streams(self) -> list[WorkerStream]:
        """[]: in process there is no worker direct-dispatch, so no worker stream."""
        self._running_loop()
        return []

    async def delete_worker_stream(self, stream: WorkerStream) -> bool:
        """False: there is no worker stream to delete."""
        self._running_loop()
        return False

    # MessageBus

    @property
    def max_payload(self) -> None:
        """No limit: results and work items pass by reference, so nothing is chunked or offloaded."""
        return None

    async def publish_result(self, subject: str, result: WorkResult) -> None:
        """Hand `result` to every matching result subscription before returning."""
        self._running_loop()
        await self._bus.dispatch(subject, result)

    async def subscribe_results(self, subject: str, handler: ResultHandler) -> BusSubscription:
        """Call `handler(result)` for results published under `subject` (NATS wildcards)."""
        self._running_loop()
        return self._bus.add(subject, _ResultCallback(handler))

    async def publish(self, subject: str, message: Any) -> None:
        """Hand `message` to every matching subscription before returning."""
        self._running_loop()
        await self._bus.dispatch(subject, message)

    async def subscribe(
        self, subject: str, handler: MessageHandler, message_type: type | None = None
    ) -> BusSubscription:
        """Call `handler(subject, message)` for messages published under `subject` (NATS wildcards);
        objects pass by reference, so `message_type` needs no decoding here."""
        self._running_loop()
        return self._bus.add(subject, handler)

    async def flush(self) -> None:
        """Nothing is buffered: a publish has reached its subscribers when it returns."""
        self._running_loop()

    def on_reconnect(self, listener: Callable[[], None]) -> None:
        """Never called: the in-process bus has no connection to lose."""

    def dead_letters(self) -> LoopbackDeadLetterStore:
        """The dead letters of this transport's pool streams (in memory, bounded)."""
        return self._dead_letters

    # internals

    def _stream_named(self, name: str) -> PoolStream | None:
        return next((stream for stream in self._streams.values() if stream.name == name), None)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._closed or self._loop is None:
            state = "closed" if self._closed else "not started (use `async with`)"
            raise TransportUnavailable(f"loopback transport is {state}")
        return self._loop

    def _stream(self, pool: str) -> PoolStream:
        loop = self._running_loop()
        stream = self._streams.get(pool)
        if stream is None:
            stream = self._streams[pool] = PoolStream(pool, self.settings, loop, self._publish_advisory)
        return stream

    def _publish_advisory(self, subject: str, advisory: MaxDeliveriesAdvisory) -> None:
        # Called from timer callbacks, so the bus dispatch needs a task; kept until done, cancelled on close.
        if self._loop is None or self._closed:
            return
        task = self._loop.create_task(self._bus.dispatch(subject, advisory))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class _ResultCallback:
    """Adapts a one-argument result handler to the bus's (subject, message) calls."""

    __slots__ = ("_handler",)

    def __init__(self, handler: ResultHandler) -> None:
        self._handler = handler

    def __call__(self, subject: str, message: Any) -> Any:
        return self._handler(message)
