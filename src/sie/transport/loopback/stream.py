"""A loopback pool stream (`WORK_POOL_{pool}`): its stored messages, each lane's ready queue and waiting fetchers,
the lane consumer's fetch and the deliveries it hands out, with WorkQueue retention, discard-new at `max_msgs`,
`max_age`, ack-wait redelivery, nak delays and max-deliver on `loop.call_at` timers (no polling, no tasks).
A message that used its last delivery stays, as on JetStream, until the dead letters take it (`take_dead`).

PoolStream makes every state change; a LaneQueue only orders messages and wakes fetchers, a delivery only
checks the settle-once rule (transport/delivery.py) and forwards its verb.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections import deque
from collections.abc import Callable

from sie.catalog.names import max_deliveries_advisory_subject, work_pool_stream_name, work_pool_stream_subjects
from sie.settings import StreamSettings
from sie.transport.base import (
    BackpressureError,
    Delivery,
    LaneDepth,
    MaxDeliveriesAdvisory,
    TransportError,
    TransportUnavailable,
)
from sie.transport.delivery import BaseDelivery
from sie.transport.loopback.bus import SubjectPattern
from sie.wire.queue import WorkItem

# (advisory subject, advisory) -> None; the transport publishes it on the bus.
AdvisorySink = Callable[[str, MaxDeliveriesAdvisory], None]

# Message states: READY sits in a lane deque, DELIVERED waits for settlement or ack-wait,
# DELAYED waits for its nak delay, DEAD used its last delivery and waits for the dead letters,
# REMOVED is gone from the stream (acked, termed, expired, taken by the dead letters).
READY, DELIVERED, DELAYED, DEAD, REMOVED = range(5)

# Removed messages stay in a deque until popped; compact once they are most of it (amortised O(1)).
_COMPACT_MIN_TOMBSTONES = 64


class StoredMessage:
    """One work item held by a pool stream, with its delivery bookkeeping."""

    __slots__ = (
        "seq", "subject", "item", "lane", "published_at", "deliveries", "state", "timer", "deadline", "delivery",
    )  # fmt: skip

    def __init__(self, seq: int, subject: str, item: WorkItem, lane: LaneQueue, published_at: float) -> None:
        self.seq = seq
        self.subject = subject
        self.item = item
        self.lane = lane
        self.published_at = published_at
        self.deliveries = 0
        self.state = READY
        self.timer: asyncio.TimerHandle | None = None
        self.deadline = 0.0
        self.delivery: LoopbackDelivery | None = None


class LaneQueue:
    """Ready messages of one lane (redeliveries first, as JetStream does) and the fetchers waiting on them."""

    def __init__(self, key: str, loop: asyncio.AbstractEventLoop) -> None:
        self.key = key
        self.consumer_name: str | None = None
        self._loop = loop
        self._fresh: deque[StoredMessage] = deque()
        self._redeliver: deque[StoredMessage] = deque()
        self._waiters: deque[asyncio.Future[bool]] = deque()
        self._tombstones = 0

    def push(self, message: StoredMessage, *, redelivery: bool) -> None:
        """Make `message` ready and wake one waiting fetcher."""
        message.state = READY
        (self._redeliver if redelivery else self._fresh).append(message)
        self._wake_one()

    def pop(self, max_items: int) -> list[StoredMessage]:
        """Take up to `max_items` ready messages, skipping ones removed while they waited."""
        taken: list[StoredMessage] = []
        for queue in (self._redeliver, self._fresh):
            while queue and len(taken) < max_items:
                message = queue.popleft()
                if message.state == REMOVED:
                    self._tombstones -= 1
                else:
                    taken.append(message)
        return taken

    def forget_ready(self) -> None:
        """A READY message was removed from the stream; it is skipped when popped."""
        self._tombstones += 1
        if self._tombstones >= _COMPACT_MIN_TOMBSTONES and 2 * self._tombstones > len(self._fresh) + len(
            self._redeliver
        ):
            self._fresh = deque(message for message in self._fresh if message.state != REMOVED)
            self._redeliver = deque(message for message in self._redeliver if message.state != REMOVED)
            self._tombstones = 0

    async def wait(self, deadline: float) -> bool:
        """Sleep until a message is pushed (True) or the loop time reaches `deadline` (False)."""
        waiter: asyncio.Future[bool] = self._loop.create_future()
        self._waiters.append(waiter)
        timer = self._loop.call_at(deadline, _expire, waiter)
        try:
            woken = await waiter
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise
        finally:
            timer.cancel()
        if not woken:
            self._discard(waiter)
        return woken

    def close(self) -> None:
        """Drop every ready message and wake every waiter (the transport closed)."""
        self._fresh.clear()
        self._redeliver.clear()
        self._tombstones = 0
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return

    def _abandon(self, waiter: asyncio.Future[bool]) -> None:
        # A fetcher cancelled after its wake-up must hand the wake-up on, or a ready message could
        # sit unseen while another fetcher sleeps.
        if waiter.done() and not waiter.cancelled() and waiter.result():
            if self._fresh or self._redeliver:
                self._wake_one()
        else:
            self._discard(waiter)

    def _discard(self, waiter: asyncio.Future[bool]) -> None:
        # ValueError: already popped by a wake-up that found it expired.
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)


class PoolStream:
    """One pool's stream and the durable lane consumers on it."""

    def __init__(
        self, pool: str, settings: StreamSettings, loop: asyncio.AbstractEventLoop, advisories: AdvisorySink
    ) -> None:
        self.name = work_pool_stream_name(pool)
        self.loop = loop
        self.closed = False
        self._settings = settings
        self._advisories = advisories
        self._subjects = tuple(SubjectPattern(subject) for subject in work_pool_stream_subjects(pool))
        # Insertion order is publish order, so the first entries are the oldest (max_age expiry).
        self._messages: dict[int, StoredMessage] = {}
        self._lanes: dict[str, LaneQueue] = {}
        self._next_seq = 1
        self._expiry: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._messages)

    def publish(self, subject: str, tokens: list[str], item: WorkItem) -> None:
        """Store one work item on its lane; discard-new when the stream already holds `max_msgs`."""
        if not any(pattern.matches(subject, tokens) for pattern in self._subjects):
            raise TransportError(f"no stream captures subject {subject!r} (stream {self.name})")
        if len(self._messages) >= self._settings.max_msgs:
            raise BackpressureError(
                f"stream {self.name}: maximum messages exceeded (max_msgs={self._settings.max_msgs})"
            )
        lane = self._lane(subject.rpartition(".")[0])
        message = StoredMessage(self._next_seq, subject, item, lane, self.loop.time())
        self._next_seq += 1
        self._messages[message.seq] = message
        if self._expiry is None:
            self._arm_expiry(message.published_at)
        lane.push(message, redelivery=False)

    def attach(self, lane_filter: str, consumer_name: str) -> LaneQueue:
        """The durable consumer for `lane_filter` (`….{bundle}.*`), created on first attach."""
        lane = self._lane(_lane_key(lane_filter))
        lane.consumer_name = consumer_name
        return lane

    def has_consumer(self, lane_filter: str) -> bool:
        """Whether a consumer was ever attached to `lane_filter` (durable consumers outlive fetchers)."""
        lane = self._lanes.get(_lane_key(lane_filter))
        return lane is not None and lane.consumer_name is not None

    def lane_depth(self, lane_filter: str) -> LaneDepth:
        """Messages of the lane for `lane_filter` not yet delivered (ready or waiting for a NAK delay), and delivered
        ones not yet settled; one pass over the stream (at most max_msgs messages)."""
        lane = self._lanes.get(_lane_key(lane_filter))
        delivered = pending = 0
        for message in self._messages.values():
            if message.lane is not lane:
                continue
            if message.state == DELIVERED:
                delivered += 1
            elif message.state in (READY, DELAYED):
                pending += 1
        return LaneDepth(pending, delivered)

    def deliver(self, lane: LaneQueue, max_items: int) -> list[Delivery]:
        """Hand out up to `max_items` ready messages of `lane`, each with its ack-wait timer armed."""
        deadline = self.loop.time() + self._settings.ack_wait_s
        deliveries: list[Delivery] = []
        for message in lane.pop(max_items):
            message.deliveries += 1
            message.state = DELIVERED
            message.deadline = deadline
            message.timer = self.loop.call_at(deadline, self._ack_wait_expired, message, deadline)
            message.delivery = delivery = LoopbackDelivery(self, message)
            deliveries.append(delivery)
        return deliveries

    def remove(self, message: StoredMessage) -> None:
        """ack: remove by stream sequence, even from a stale delivery (as JetStream does)."""
        if message.state != REMOVED:
            self._drop(message)

    def nak(self, message: StoredMessage, delivery: LoopbackDelivery, delay_s: float) -> None:
        """Redeliver after `delay_s`; a stale delivery's nak does nothing (the message moved on)."""
        if message.delivery is delivery and message.timer is not None:
            message.timer.cancel()
            self._retry(message, delay_s)

    def extend(self, message: StoredMessage, delivery: LoopbackDelivery) -> None:
        """in_progress: push the ack-wait deadline; the armed timer re-arms itself when it fires."""
        if message.delivery is delivery:
            message.deadline = self.loop.time() + self._settings.ack_wait_s

    def take_dead(self, seq: int) -> StoredMessage | None:
        """Remove and return the message `seq` if it used its last delivery (the dead letters take it)."""
        message = self._messages.get(seq)
        if message is None or message.state != DEAD:
            return None
        self._drop(message)
        return message

    def close(self) -> None:
        """Cancel every timer and wake every fetcher; the messages are gone with the transport."""
        self.closed = True
        if self._expiry is not None:
            self._expiry.cancel()
        for message in self._messages.values():
            if message.timer is not None:
                message.timer.cancel()
        for lane in self._lanes.values():
            lane.close()

    def _lane(self, key: str) -> LaneQueue:
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = LaneQueue(key, self.loop)
        return lane

    def _retry(self, message: StoredMessage, delay_s: float) -> None:
        message.delivery = None
        message.timer = None
        max_deliver = self._settings.max_deliver
        if 0 < max_deliver <= message.deliveries:
            self._dead_letter(message)
        elif delay_s > 0:
            message.state = DELAYED
            message.timer = self.loop.call_later(delay_s, self._redeliver, message)
        else:
            message.lane.push(message, redelivery=True)

    def _redeliver(self, message: StoredMessage) -> None:
        message.timer = None
        message.lane.push(message, redelivery=True)

    def _ack_wait_expired(self, message: StoredMessage, armed_for: float) -> None:
        if message.deadline > armed_for:  # in_progress moved the deadline since this timer was armed
            message.timer = self.loop.call_at(message.deadline, self._ack_wait_expired, message, message.deadline)
        else:
            self._retry(message, 0.0)

    def _drop(self, message: StoredMessage) -> None:
        del self._messages[message.seq]
        if message.state == READY:
            message.lane.forget_ready()
        if message.timer is not None:
            message.timer.cancel()
            message.timer = None
        message.state = REMOVED
        message.delivery = None

    def _dead_letter(self, message: StoredMessage) -> None:
        # As JetStream: the message stays in the stream (counting toward max_msgs) and an advisory names it;
        # the dead letters take it from there (take_dead), or max_age does.
        message.state = DEAD
        consumer = message.lane.consumer_name or ""
        advisory = MaxDeliveriesAdvisory(
            stream=self.name,
            consumer=consumer,
            stream_seq=message.seq,
            deliveries=message.deliveries,
            id=f"{self.name}.{message.seq}",
            timestamp=datetime.datetime.now(datetime.UTC).isoformat(),
        )
        self._advisories(max_deliveries_advisory_subject(self.name, consumer), advisory)

    def _arm_expiry(self, oldest_published_at: float) -> None:
        if self._settings.max_age_s > 0:
            when = oldest_published_at + self._settings.max_age_s
            self._expiry = self.loop.call_at(when, self._expire_old, when)

    def _expire_old(self, armed_for: float) -> None:
        # The loop may run a timer a clock tick early, so the cutoff uses the time it was armed for.
        self._expiry = None
        cutoff = max(self.loop.time(), armed_for) - self._settings.max_age_s
        expired = []
        for message in self._messages.values():
            if message.published_at > cutoff:
                self._arm_expiry(message.published_at)
                break
            expired.append(message)
        for message in expired:
            self._drop(message)


class LoopbackLaneConsumer:
    """One fetcher handle on a lane's durable consumer; several handles split the lane's work."""

    def __init__(self, stream: PoolStream, lane: LaneQueue) -> None:
        self._stream = stream
        self._lane = lane

    async def fetch(self, max_items: int, timeout_s: float) -> list[Delivery]:
        """Up to `max_items` deliveries; waits at most `timeout_s` for the first one, returns [] on timeout."""
        if max_items < 1:
            raise ValueError(f"max_items must be at least 1, got {max_items}")
        self._check_open()
        deliveries = self._stream.deliver(self._lane, max_items)
        if deliveries or timeout_s <= 0:
            return deliveries
        deadline = self._stream.loop.time() + timeout_s
        # Another fetcher may take the message that woke us; then wait again until the same deadline.
        while await self._lane.wait(deadline):
            self._check_open()
            deliveries = self._stream.deliver(self._lane, max_items)
            if deliveries:
                return deliveries
        return []

    def _check_open(self) -> None:
        if self._stream.closed:
            raise TransportUnavailable("fetch on a closed loopback transport")


class LoopbackDelivery(BaseDelivery):
    """A work item handed to one fetcher; `num_delivered` is 1 on the first delivery."""

    __slots__ = ("_stream", "_message")

    transport_name = "loopback"

    def __init__(self, stream: PoolStream, message: StoredMessage) -> None:
        BaseDelivery.__init__(self, message.item, message.subject, message.deliveries)
        self._stream = stream
        self._message = message

    def __repr__(self) -> str:
        return f"LoopbackDelivery({self.subject!r}, seq={self._message.seq}, num_delivered={self.num_delivered})"

    def _closed(self) -> bool:
        return self._stream.closed

    async def _ack(self) -> None:
        self._stream.remove(self._message)

    async def _nak(self, delay_s: float) -> None:
        self._stream.nak(self._message, self, delay_s)

    async def _in_progress(self) -> None:
        self._stream.extend(self._message, self)


def _lane_key(subject: str) -> str:
    """Lane subjects share everything up to the model token; a lane filter ends in `.*` there."""
    return subject.rpartition(".")[0]


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)
