"""A Transport that connects in the background (issue 13 §3; seed 000 §13 for the config service): a role starts,
serves its probes and answers 503 while its broker is unreachable, and starts using the broker once it answers,
without a restart.

`ReconnectingTransport(open_transport)` calls `open_transport()` for a fresh inner transport (an async context
manager) and enters it in a task started on enter; a failed attempt is retried after a backoff doubling from 0.5 s
to 10 s. Until it is connected, publishes, `pending`, `has_consumer`, `flush` and the worker-stream calls raise
TransportUnavailable; subscriptions are recorded and made on connect, before anything else may use the inner
transport; a lane consumer (and a worker's direct-dispatch consumer) attaches on its first fetch after connect; the
dead letters and key-value buckets answer once connected. Once connected, the inner transport's own reconnect logic
takes over (nats-py re-establishes subscriptions across reconnects). Exit cancels the task and closes the inner
transport.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import TracebackType
from typing import Any, Final, Self, cast

from sie.pools import KeyValue, KeyValueEntry
from sie.transport.base import (
    DeadLetter,
    DeadLetterStore,
    Delivery,
    KeyValueBuckets,
    Lane,
    LaneConsumer,
    LaneDepth,
    MaxDeliveriesAdvisory,
    MessageHandler,
    ResultHandler,
    ResultMessage,
    Subscription,
    Transport,
    TransportError,
    TransportUnavailable,
    WorkerStream,
)
from sie.wire.queue import WorkItem

logger = logging.getLogger(__name__)

INITIAL_BACKOFF_S: Final = 0.5
MAX_BACKOFF_S: Final = 10.0

TransportOpener = Callable[[], AbstractAsyncContextManager[Transport]]
Subscribe = Callable[[Transport], Awaitable[Subscription]]
InnerWithin = Callable[[float], Awaitable[Transport | None]]
Attach = Callable[[Transport], Awaitable[LaneConsumer | None]]


class ReconnectingTransport:
    """Holds no inner transport until a background task has opened one; `unavailable_reason()` says why not yet."""

    def __init__(
        self,
        open_transport: TransportOpener,
        *,
        description: str = "the broker",
        initial_backoff_s: float = INITIAL_BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
    ) -> None:
        self._open_transport = open_transport
        self._description = description
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._stack: AsyncExitStack | None = None
        self._inner: Transport | None = None
        self._deferred: list[_DeferredSubscription] = []
        self._reconnect_listeners: list[Callable[[], None]] = []
        self._settled: asyncio.Event | None = None  # set once connected or closed
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._last_error = "not connected yet"

    def unavailable_reason(self) -> str | None:
        """Why the transport cannot be used now (for `/readyz` and 503 answers); None once connected."""
        if self._inner is not None:
            return None
        if self._closed:
            return f"the transport to {self._description} is closed"
        return f"{self._description} is not connected ({self._last_error})"

    async def __aenter__(self) -> Self:
        if self._task is not None or self._closed:
            raise TransportUnavailable("a ReconnectingTransport is entered once; create a new one")
        self._settled = asyncio.Event()
        self._task = asyncio.create_task(self._connect(), name=f"connect {self._description}")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # waits without swallowing a cancellation of our own caller
        if self._settled is not None:
            self._settled.set()  # wakes lane consumers waiting for a connection: they raise now
        self._inner = None
        self._deferred.clear()
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    # connecting

    async def _connect(self) -> None:
        backoff = self._initial_backoff_s
        attempts = 0
        # Until closed, not only until cancelled: a cancellation that lands as a connect attempt fails can come out
        # as that failure instead (asyncio.wait_for inside nats-py's connect, Python 3.11), and a loop that retried
        # then would keep `__aexit__` waiting for it for good (a config role stopped while NATS was down did).
        while not self._closed:
            attempts += 1
            try:
                await self._open_once()
            except TransportError as exc:
                self._last_error = str(exc)
                if self._closed:
                    return
                self._log_failure(attempts, backoff)
            except Exception as exc:  # noqa: BLE001 - any failed attempt is retried: a role must not stay unconnected
                self._last_error = f"{type(exc).__name__}: {exc}"
                if self._closed:
                    return
                logger.exception("connecting to %s failed unexpectedly; retrying in %.1f s", self._description, backoff)
            else:
                logger.info("connected to %s", self._description)
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._max_backoff_s)

    def _log_failure(self, attempts: int, backoff: float) -> None:
        """One warning for the outage (the first failure), then debug lines: `/readyz` keeps telling the state."""
        if attempts == 1:
            logger.warning("%s is unreachable; serving without it and retrying in the background: %s",
                           self._description, self._last_error)  # fmt: skip
        else:
            logger.debug("%s still unreachable (attempt %d, next in %.1f s): %s",
                         self._description, attempts, backoff, self._last_error)  # fmt: skip

    async def _open_once(self) -> None:
        """Enter a fresh inner transport and make the recorded subscriptions on it; on failure close it again."""
        stack = AsyncExitStack()
        try:
            inner = await stack.enter_async_context(self._open_transport())
            await self._establish(inner)
        except BaseException:
            for subscription in self._deferred:
                subscription.lost()
            await stack.aclose()
            raise
        # No await from the last subscription made to here: nothing can record one the loop would miss.
        for listener in self._reconnect_listeners:
            inner.on_reconnect(listener)
        self._stack, self._inner = stack, inner
        self._deferred.clear()
        if self._settled is not None:
            self._settled.set()

    async def _establish(self, inner: Transport) -> None:
        """Make every recorded subscription, including those recorded while this runs."""
        while waiting := [subscription for subscription in self._deferred if not subscription.made]:
            for subscription in waiting:
                await subscription.make(inner)

    def _current(self, action: str) -> Transport:
        inner = self._inner
        if inner is None:
            raise TransportUnavailable(f"{action}: {self.unavailable_reason()}")
        return inner

    def _check_open(self, action: str) -> None:
        if self._closed or self._settled is None:
            state = "closed" if self._closed else "not started (use `async with`)"
            raise TransportUnavailable(f"{action}: the transport to {self._description} is {state}")

    async def _inner_within(self, timeout_s: float) -> Transport | None:
        """The inner transport once connected, waiting up to `timeout_s`; None on timeout, raises once closed."""
        if self._inner is None and not self._closed and self._settled is not None:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._settled.wait()
            except TimeoutError:
                return None
        return self._current("fetch")

    def _forget(self, subscription: _DeferredSubscription) -> None:
        if subscription in self._deferred:
            self._deferred.remove(subscription)

    # WorkQueue

    async def publish_work(self, subject: str, item: WorkItem) -> None:
        await self._current("publish_work").publish_work(subject, item)

    async def submit_work_batch(self, subject: str, items: Sequence[WorkItem]) -> asyncio.Future[None]:
        return await self._current("submit_work_batch").submit_work_batch(subject, items)

    async def consumer(self, lane: Lane) -> LaneConsumer:
        """The lane's consumer; before connect, or while the broker cannot make it, one that attaches on a later
        fetch and returns no deliveries until then (each fetch waits for the connection up to its timeout)."""
        description = f"lane {lane.pool}/{lane.machine_profile}/{lane.bundle}"
        # cast: the inner transports' consumer() always makes one (only worker_consumer may answer None)
        return cast(LaneConsumer, await self._consumer_now_or_later(description, lambda inner: inner.consumer(lane)))

    async def worker_consumer(self, lane: Lane, worker_id: str) -> LaneConsumer | None:
        """The worker's direct-dispatch consumer; before connect, or while the broker cannot make it, one that
        attaches on a later fetch (and then only waits out each fetch's timeout if the inner transport has no
        direct dispatch)."""
        return await self._consumer_now_or_later(f"worker {worker_id}",
                                                 lambda inner: inner.worker_consumer(lane, worker_id))  # fmt: skip

    async def _consumer_now_or_later(self, description: str, attach: Attach) -> LaneConsumer | None:
        """The inner transport's consumer when it can make one now. Connected is not enough: right after a
        JetStream cluster starts, its API answers with timeouts while it elects its leaders, so making a stream or
        consumer can fail for seconds; the consumer is then made on a later fetch, whose failures the lane's fetch
        loop retries, instead of failing the role's start."""
        if self._inner is not None:
            try:
                return await attach(self._inner)
            except TransportUnavailable as exc:
                logger.warning("the consumer of %s cannot be made yet (%s); trying again on its next fetch",
                               description, exc)  # fmt: skip
        self._check_open(description)
        return _DeferredLane(description, self._inner_within, attach)

    async def pending(self, pool: str) -> int:
        return await self._current("pending").pending(pool)

    async def has_consumer(self, lane: Lane) -> bool:
        return await self._current("has_consumer").has_consumer(lane)

    async def lane_depth(self, lane: Lane) -> LaneDepth:
        return await self._current("lane_depth").lane_depth(lane)

    # WorkerStreams

    async def worker_streams(self) -> list[WorkerStream]:
        return await self._current("worker_streams").worker_streams()

    async def delete_worker_stream(self, stream: WorkerStream) -> bool:
        return await self._current("delete_worker_stream").delete_worker_stream(stream)

    # MessageBus

    @property
    def max_payload(self) -> int | None:
        """The inner transport's once connected; None before (nothing is published then)."""
        return self._inner.max_payload if self._inner is not None else None

    async def publish_result(self, subject: str, result: ResultMessage) -> None:
        await self._current("publish_result").publish_result(subject, result)

    async def subscribe_results(self, subject: str, handler: ResultHandler) -> Subscription:
        """Subscribe now when connected, else on connect (the subscription is recorded until then)."""
        return await self._subscribe(subject, lambda inner: inner.subscribe_results(subject, handler))

    async def publish(self, subject: str, message: Any) -> None:
        await self._current("publish").publish(subject, message)

    async def subscribe(self, subject: str, handler: MessageHandler, message_type: type | None = None) -> Subscription:
        """Subscribe now when connected, else on connect (the subscription is recorded until then)."""
        return await self._subscribe(subject, lambda inner: inner.subscribe(subject, handler, message_type))

    async def flush(self) -> None:
        await self._current("flush").flush()

    def on_reconnect(self, listener: Callable[[], None]) -> None:
        """Passed to the inner transport once connected (now, if it is); its reconnects are the ones that count:
        the first connect follows no drop, so nothing published to this process was lost before it."""
        self._reconnect_listeners.append(listener)
        if self._inner is not None:
            self._inner.on_reconnect(listener)

    def dead_letters(self) -> DeadLetterStore:
        """The inner transport's dead letters; each call raises TransportUnavailable until connected."""
        return _DeadLettersOnceConnected(self._current)

    def key_value(self, bucket: str) -> KeyValue:
        """The inner transport's key-value bucket `bucket`; each call raises TransportUnavailable until connected."""
        return _KeyValueOnceConnected(self._current, bucket)

    async def _subscribe(self, subject: str, subscribe: Subscribe) -> Subscription:
        if self._inner is not None:
            return await subscribe(self._inner)
        self._check_open(f"subscribe to {subject}")
        deferred = _DeferredSubscription(subscribe, self._forget)
        self._deferred.append(deferred)
        return deferred


class _DeferredSubscription:
    """A subscription recorded before connect: `make` subscribes it on the inner transport; `unsubscribe` works
    before and after."""

    def __init__(self, subscribe: Subscribe, forget: Callable[[_DeferredSubscription], None]) -> None:
        self._subscribe = subscribe
        self._forget = forget
        self._live: Subscription | None = None
        self._cancelled = False

    @property
    def made(self) -> bool:
        """Whether nothing is left to do on connect: subscribed, or unsubscribed before that."""
        return self._live is not None or self._cancelled

    async def make(self, inner: Transport) -> None:
        if self._cancelled:
            return
        live = await self._subscribe(inner)
        if self._cancelled:  # unsubscribed while subscribing
            await live.unsubscribe()
            return
        self._live = live

    def lost(self) -> None:
        """The inner transport it was made on is gone; the next connect makes it again."""
        self._live = None

    async def unsubscribe(self) -> None:
        self._cancelled = True
        self._forget(self)
        live, self._live = self._live, None
        if live is not None:
            await live.unsubscribe()


class _DeferredLane:
    """A consumer asked for before connect: `attach`es to the inner transport's on the first fetch after. Where the
    inner transport has none (`attach` returns None), each fetch returns nothing after its timeout."""

    def __init__(self, description: str, inner_within: InnerWithin, attach: Attach) -> None:
        self._description = description
        self._inner_within = inner_within
        self._attach = attach
        self._attached: LaneConsumer | None = None
        self._absent = False

    async def fetch(self, max_items: int, timeout_s: float) -> list[Delivery]:
        attached = self._attached
        if attached is None:
            inner = await self._inner_within(timeout_s)
            if inner is None:
                return []
            if not self._absent:
                attached = self._attached = await self._attach(inner)
            if attached is None:
                self._absent = True
                await asyncio.sleep(timeout_s)  # never a hot loop for a caller that fetches again at once
                return []
            logger.info("attached to the consumer of %s", self._description)
        return await attached.fetch(max_items, timeout_s)


class _DeadLettersOnceConnected:
    """The dead letters of whichever inner transport is connected when asked."""

    def __init__(self, current: Callable[[str], Transport]) -> None:
        self._current = current

    def _store(self, action: str) -> DeadLetterStore:
        return self._current(f"dead letters: {action}").dead_letters()

    async def stranded(self, limit: int, min_age_s: float) -> list[MaxDeliveriesAdvisory]:
        return await self._store("look for spent work").stranded(limit, min_age_s)

    async def capture(self, advisory: MaxDeliveriesAdvisory) -> DeadLetter | None:
        return await self._store("capture").capture(advisory)

    async def letters(self, after: int, limit: int) -> list[DeadLetter]:
        return await self._store("list").letters(after, limit)

    async def get(self, letter_id: int) -> DeadLetter | None:
        return await self._store("get").get(letter_id)

    async def delete(self, letter_id: int) -> bool:
        return await self._store("delete").delete(letter_id)

    async def purge(self) -> int:
        return await self._store("purge").purge()


class _KeyValueOnceConnected:
    """A key-value bucket of whichever inner transport is connected when asked."""

    def __init__(self, current: Callable[[str], Transport], bucket: str) -> None:
        self._current = current
        self._bucket = bucket

    def _opened(self, action: str) -> KeyValue:
        inner = self._current(f"key-value bucket {self._bucket}: {action}")
        if not isinstance(inner, KeyValueBuckets):
            raise TransportError(f"{type(inner).__name__} keeps no key-value buckets")
        return inner.key_value(self._bucket)

    async def get(self, key: str) -> KeyValueEntry | None:
        return await self._opened("get").get(key)

    async def create(self, key: str, value: bytes) -> int | None:
        return await self._opened("create").create(key, value)

    async def update(self, key: str, value: bytes, revision: int) -> int | None:
        return await self._opened("update").update(key, value, revision)

    async def delete(self, key: str, revision: int | None = None) -> bool:
        return await self._opened("delete").delete(key, revision)

    async def keys(self) -> list[str]:
        return await self._opened("keys").keys()


__all__ = ["INITIAL_BACKOFF_S", "MAX_BACKOFF_S", "ReconnectingTransport", "TransportOpener"]
