"""The publishing side of the pool streams: publish_work (msgpack, JetStream publish, its ACK awaited under
the 6 s bound of acks.py) and the cached stream depth behind `pending` (seed 000 §8.2).

Why publish_work awaits its ACK: the WorkQueue protocol promises that a returned publish was accepted, and
BackpressureError must reach the caller of the publish that hit max_msgs. Concurrent publishes still overlap
(at most MAX_PENDING_ACKS at once), so a request's items published together wait one round-trip, not one per
item; `submit_work` is the same publish without the wait, for a caller that drains many ACKs at once.

A worker direct-dispatch subject (seed 000 §8.2) is captured by that worker's own stream, which only its sidecar
creates: a publish there creates nothing, and JetStream's "no responders" (no such stream) becomes NoConsumerError,
so the gateway publishes on the lane instead. A worker found without a stream is remembered for
ABSENT_WORKER_TTL_S, in which further publishes to it raise NoConsumerError at once, without a round trip.
"""

from __future__ import annotations

import asyncio

import nats.js.errors

from sie.catalog.names import is_work_worker_subject, work_pool_stream_name
from sie.transport.base import BackpressureError, NoConsumerError, TransportError, pool_of
from sie.transport.nats.acks import AckInbox
from sie.transport.nats.cache import TtlCache
from sie.transport.nats.connection import Connection
from sie.transport.nats.errors import for_worker, translated
from sie.transport.nats.streams import StreamRegistry
from sie.wire import to_msgpack
from sie.wire.queue import WorkItem

# `pending` is read per request by a gateway; the stream depth may be this stale.
PENDING_TTL_S = 0.05
# A worker subject nothing captured is refused at once for this long; a sidecar's new stream is used after it.
ABSENT_WORKER_TTL_S = 1.0


class StreamPublisher:
    """publish_work and pending for every pool on one connection."""

    def __init__(self, connection: Connection, streams: StreamRegistry) -> None:
        self._connection = connection
        self._streams = streams
        self._depth: TtlCache[str, int] = TtlCache(PENDING_TTL_S)
        self._absent_workers: TtlCache[str, bool] = TtlCache(ABSENT_WORKER_TTL_S)
        self._acks = AckInbox(connection)

    async def start(self) -> None:
        """Subscribe the ACK inbox."""
        await self._acks.start()

    def close(self) -> None:
        """Fail the publishes still waiting for their ACK."""
        self._acks.fail_all("the NATS transport closed before JetStream acknowledged the publish")

    async def publish(self, subject: str, item: WorkItem) -> None:
        """Queue `item`; returns once JetStream stored it. BackpressureError when the stream is full."""
        try:
            await (await self.submit(subject, item))
        except TransportError as exc:
            if isinstance(exc, NoConsumerError) or not isinstance(exc.__cause__, nats.js.errors.NoStreamResponseError):
                raise
            # The stream was deleted behind our back (or never captured this subject): ensure it, retry once.
            await (await self.submit(subject, item))

    async def submit(self, subject: str, item: WorkItem) -> asyncio.Future[None]:
        """Publish `item` now; the returned future completes once JetStream stored it (or fails as publish does)."""
        pool = pool_of(subject)
        self._connection.check_connected("publish_work")
        if is_work_worker_subject(subject):
            return await self._submit_direct(subject, item)
        await self._streams.ensure_stream(pool)
        stored = await self._acks.submit(subject, to_msgpack(item))
        stored.add_done_callback(lambda done: self._account(pool, done))
        return stored

    async def _submit_direct(self, subject: str, item: WorkItem) -> asyncio.Future[None]:
        """Publish on a worker's stream (never created here); the future fails with NoConsumerError without one."""
        if self._absent_workers.peek(subject) is not None:
            raise NoConsumerError(f"publish to {subject}: the worker has no direct-dispatch stream")
        stored = await self._acks.submit(subject, to_msgpack(item))
        relayed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        stored.add_done_callback(lambda done: self._relay_direct(subject, done, relayed))
        relayed.add_done_callback(lambda done: stored.cancel() if done.cancelled() else None)
        return relayed

    def _relay_direct(self, subject: str, stored: asyncio.Future[None], relayed: asyncio.Future[None]) -> None:
        error = None if stored.cancelled() else stored.exception()
        if relayed.done():
            return
        if stored.cancelled():
            relayed.cancel()
        elif error is None:
            relayed.set_result(None)
        else:
            error = for_worker(error, subject) if isinstance(error, TransportError) else error
            if isinstance(error, NoConsumerError):
                self._absent_workers.put(subject, True)
            relayed.set_exception(error)

    async def pending(self, pool: str) -> int:
        """Messages in `WORK_POOL_{pool}` (queued, delayed, or delivered and unacked); 0 before it exists."""
        self._connection.check("pending")
        return await self._depth.get(pool, lambda: self._stream_depth(pool))

    def _account(self, pool: str, done: asyncio.Future[None]) -> None:
        if done.cancelled():
            return  # its caller left; whether it was stored is unknown until the next lookup
        error = done.exception()
        if error is None:
            # The cached depth follows our own publishes, so a gateway sees its burst before the next lookup.
            self._depth.update(pool, _plus_one)
        elif isinstance(error, BackpressureError):
            self._depth.forget(pool)
        elif isinstance(error.__cause__, nats.js.errors.NoStreamResponseError):
            self._streams.forget_stream(pool)

    async def _stream_depth(self, pool: str) -> int:
        name = work_pool_stream_name(pool)
        self._connection.check_connected(f"stream info {name}")
        with translated(f"stream info {name}"):
            try:
                info = await self._connection.jsm.stream_info(name)
            except nats.js.errors.NotFoundError:
                return 0
        return info.state.messages


def _plus_one(depth: int) -> int:
    return depth + 1
