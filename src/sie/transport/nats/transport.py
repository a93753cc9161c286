"""NatsTransport: the Transport protocol over one NATS connection (JetStream work queues, core pub/sub), with
the loopback's semantics (DESIGN.md §4). Composes the connection, stream registry, publisher, lane fetchers
and bus, and owns their lifecycle; every call after exit raises TransportUnavailable.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

import attrs

from sie.catalog.names import work_pool_stream_name, work_worker_stream_name
from sie.settings import StreamSettings
from sie.settings.messaging import NatsSettings
from sie.transport.base import (
    ACK_DRAIN_TIMEOUT_S,
    Lane,
    LaneDepth,
    MessageHandler,
    ResultHandler,
    ResultMessage,
    TransportUnavailable,
    WorkerStream,
)
from sie.transport.nats.bus import NatsBus, NatsSubscription, WantsRequest
from sie.transport.nats.cache import TtlCache
from sie.transport.nats.connection import Connection
from sie.transport.nats.consumer import LaneFetcher
from sie.transport.nats.dead_letters import NatsDeadLetterStore
from sie.transport.nats.kv import POOL_BUCKET, JetStreamKeyValue
from sie.transport.nats.streams import StreamRegistry
from sie.transport.nats.work import StreamPublisher
from sie.transport.nats.worker_streams import delete_worker_stream, list_worker_streams
from sie.wire.queue import WorkItem

logger = logging.getLogger(__name__)

# has_consumer is asked per request; a sidecar's new consumer shows up within this.
HAS_CONSUMER_TTL_S = 1.0


@attrs.frozen
class _Parts:
    """What an entered transport is made of; exists only between enter and exit."""

    connection: Connection
    streams: StreamRegistry
    work: StreamPublisher
    bus: NatsBus


class NatsTransport:
    """Work queues and pub/sub on a NATS server with JetStream.

    Use as `async with NatsTransport(nats_settings, stream_settings) as transport:`. Connecting retries a
    few times, then raises TransportUnavailable; once connected the client reconnects on its own, and
    calls made while it is away raise TransportUnavailable (core publishes are buffered meanwhile).
    """

    def __init__(self, nats: NatsSettings, streams: StreamSettings | None = None, *, name: str | None = None) -> None:
        self.nats_settings = nats
        self.settings = streams if streams is not None else StreamSettings()
        self._name = name
        self._parts: _Parts | None = None
        self._lanes: TtlCache[Lane, LaneFetcher] = TtlCache(math.inf)
        self._workers: TtlCache[tuple[Lane, str], LaneFetcher] = TtlCache(math.inf)
        self._has_consumer: TtlCache[Lane, bool] = TtlCache(HAS_CONSUMER_TTL_S)
        self._entered = False
        self._exited = False
        self._dead_letters = NatsDeadLetterStore(lambda action: self._open(action).connection, self.settings)
        self._key_values: dict[str, JetStreamKeyValue] = {}

    async def __aenter__(self) -> Self:
        if self._entered:
            raise TransportUnavailable("a NatsTransport is entered once; create a new one")
        self._entered = True
        connection = await Connection.open(self.nats_settings, self._name)
        streams = StreamRegistry(connection, self.settings)
        work = StreamPublisher(connection, streams)
        try:
            await work.start()
        except BaseException:
            await connection.close()
            raise
        self._parts = _Parts(connection, streams, work, NatsBus(connection))
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Wake blocked fetchers (they raise TransportUnavailable), hand unfetched work back, drain, close."""
        if self._exited:
            return
        self._exited = True
        parts, self._parts = self._parts, None
        if parts is None:
            return
        parts.connection.closed = True
        parts.work.close()
        for fetcher in [*self._lanes.cached_values(), *self._workers.cached_values()]:
            await _close_quietly(fetcher)
        await parts.connection.close()

    # WorkQueue

    async def publish_work(self, subject: str, item: WorkItem) -> None:
        """Queue `item` on its pool stream (created or reconciled on first use); returns once JetStream stored it."""
        await self._open("publish_work").work.publish(subject, item)

    async def submit_work_batch(self, subject: str, items: Sequence[WorkItem]) -> asyncio.Future[None]:
        """Send every item without waiting for JetStream to store it; the returned task drains their ACKs together
        (one task per request, bounded by ACK_DRAIN_TIMEOUT_S; each ACK's failure is what publish_work would
        raise). A send that fails part-way abandons the ACKs of the items already sent."""
        futures: list[asyncio.Future[None]] = []
        try:
            for item in items:
                futures.append(await self._open("submit_work").work.submit(subject, item))
        except BaseException:
            _abandon(futures)
            raise
        return asyncio.ensure_future(_drain_acks(futures))

    async def consumer(self, lane: Lane) -> LaneFetcher:
        """Attach to the lane's durable consumer (created or updated on first use); every call shares one fetcher."""
        parts = self._open("consumer")
        fetcher = await self._lanes.get(lane, lambda: self._open_lane(parts, lane))
        self._has_consumer.put(lane, True)
        return fetcher

    async def worker_consumer(self, lane: Lane, worker_id: str) -> LaneFetcher:
        """Attach to worker `worker_id`'s direct-dispatch consumer on `lane` (its stream `WORK_WORKER_{worker}` and
        durable `gen-{worker}` created or reconciled on first use); every call shares one fetcher."""
        parts = self._open("worker_consumer")
        return await self._workers.get((lane, worker_id), lambda: self._open_worker(parts, lane, worker_id))

    async def pending(self, pool: str) -> int:
        """Messages on the pool's stream: queued, delayed, or delivered and not yet settled (cached 50 ms)."""
        return await self._open("pending").work.pending(pool)

    async def has_consumer(self, lane: Lane) -> bool:
        """Whether the lane's durable consumer exists on the broker (cached 1 s)."""
        streams = self._open("has_consumer").streams
        return await self._has_consumer.get(lane, lambda: streams.consumer_exists(lane))

    async def lane_depth(self, lane: Lane) -> LaneDepth:
        """num_pending and num_ack_pending of the lane's durable consumer (a consumer info request)."""
        return await self._open("lane_depth").streams.consumer_depth(lane)

    # WorkerStreams

    async def worker_streams(self) -> list[WorkerStream]:
        """Every `WORK_WORKER_*` stream with its state (all pages of the JetStream stream list)."""
        return await list_worker_streams(self._connection("worker_streams"))

    async def delete_worker_stream(self, stream: WorkerStream) -> bool:
        """Delete `stream` and its consumer if it is still as listed; False when it is gone or changed."""
        return await delete_worker_stream(self._connection("delete_worker_stream"), stream)

    # MessageBus

    @property
    def max_payload(self) -> int | None:
        """The server's max_payload once connected (None before): results and work items must fit it."""
        return self._parts.bus.max_payload if self._parts is not None else None

    async def publish_result(self, subject: str, result: ResultMessage) -> None:
        """Send `result` (or a result chunk) as msgpack to its reply subject (core NATS)."""
        await self._open("publish_result").bus.publish_result(subject, result)

    async def subscribe_results(
        self, subject: str, handler: ResultHandler, *, wants: WantsRequest | None = None
    ) -> NatsSubscription:
        """Call `handler(result)` for results under `subject`; `wants(request_id)` False drops one undecoded."""
        return await self._open("subscribe_results").bus.subscribe_results(subject, handler, wants=wants)

    async def publish(self, subject: str, message: Any) -> None:
        """Send a control message as JSON (core NATS)."""
        await self._open("publish").bus.publish(subject, message)

    async def subscribe(
        self, subject: str, handler: MessageHandler, message_type: type | None = None
    ) -> NatsSubscription:
        """Call `handler(subject, message)` for JSON messages under `subject`, decoded into `message_type` if given."""
        return await self._open("subscribe").bus.subscribe(subject, handler, message_type)

    async def flush(self) -> None:
        """Return once everything published so far has reached the broker."""
        await self._open("flush").bus.flush()

    def on_reconnect(self, listener: Callable[[], None]) -> None:
        """Call `listener()` whenever nats-py has reconnected (to this server or another of the cluster) and sent
        the subscriptions again."""
        self._connection("on_reconnect").on_reconnect(listener)

    def dead_letters(self) -> NatsDeadLetterStore:
        """The `DEAD_LETTERS` stream on this transport's connection (usable while the transport is open)."""
        return self._dead_letters

    def key_value(self, bucket: str = POOL_BUCKET) -> JetStreamKeyValue:
        """The JetStream KV bucket `bucket` on this transport's connection (opened, or created, on first use; usable
        while the transport is open): a `sie.pools.KeyValue`."""
        key_value = self._key_values.get(bucket)
        if key_value is None:
            key_value = self._key_values[bucket] = JetStreamKeyValue(self._connection, self.settings, bucket)
        return key_value

    # internals

    def _connection(self, action: str) -> Connection:
        return self._open(action).connection

    def _open(self, action: str) -> _Parts:
        parts = self._parts
        if parts is None:
            state = "closed" if self._exited else "not started (use `async with`)"
            raise TransportUnavailable(f"{action}: NATS transport is {state}")
        parts.connection.check(action)
        return parts

    async def _open_lane(self, parts: _Parts, lane: Lane) -> LaneFetcher:
        consumer = await parts.streams.ensure_consumer(lane)
        reattach = functools.partial(parts.streams.reattach, lane)
        fetcher = LaneFetcher(parts.connection, work_pool_stream_name(lane.pool), consumer, reattach, self.settings)
        await fetcher.start()
        return fetcher

    async def _open_worker(self, parts: _Parts, lane: Lane, worker_id: str) -> LaneFetcher:
        consumer = await parts.streams.ensure_worker_consumer(lane, worker_id)
        reattach = functools.partial(parts.streams.reattach_worker, lane, worker_id)
        fetcher = LaneFetcher(parts.connection, work_worker_stream_name(worker_id), consumer, reattach, self.settings)
        await fetcher.start()
        return fetcher


async def _drain_acks(futures: list[asyncio.Future[None]]) -> None:
    """Every future's ACK within ACK_DRAIN_TIMEOUT_S; the first failure, or TransportUnavailable on timeout."""
    try:
        async with asyncio.timeout(ACK_DRAIN_TIMEOUT_S):
            await asyncio.gather(*futures)
    except TimeoutError as exc:
        raise TransportUnavailable(f"JetStream did not acknowledge {len(futures)} items in time") from exc
    finally:
        _abandon(futures)


def _abandon(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            future.exception()  # retrieved: a failure is reported once, by whoever awaits the drain


async def _close_quietly(fetcher: LaneFetcher) -> None:
    try:
        await fetcher.close()
    except Exception as exc:  # noqa: BLE001 - closing must go on to the other lanes and the connection
        logger.warning("closing lane %s: %s", fetcher.consumer, exc)
