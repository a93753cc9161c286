"""A loopback pool stream (`WORK_POOL_{pool}`): WorkQueue retention, discard-new at `max_msgs`, `max_age`,
ack-wait redelivery, nak delays and max-deliver, all on `loop.call_at` timers (no polling, no tasks).

Owns every message of one pool and its state changes; lanes only queue, deliveries only forward verbs.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from typing import Any

from sie.catalog.names import max_deliveries_advisory_subject, work_pool_stream_name, work_pool_stream_subjects
from sie.settings import StreamSettings
from sie.transport.base import BackpressureError, Delivery, TransportError
from sie.transport.loopback.delivery import LoopbackDelivery
from sie.transport.loopback.lane import DELAYED, DELIVERED, READY, REMOVED, LaneQueue, StoredMessage
from sie.transport.loopback.subjects import SubjectPattern
from sie.wire.queue import WorkItem

MAX_DELIVER_ADVISORY_TYPE = "io.nats.jetstream.advisory.v1.max_deliver"

# (advisory subject, advisory) -> None; the transport publishes it on the bus.
AdvisorySink = Callable[[str, dict[str, Any]], None]


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
        """ack / term: remove by stream sequence, even from a stale delivery (as JetStream does)."""
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
        # Real JetStream keeps a message that hit max_deliver in a WorkQueue stream, where it still counts
        # toward max_msgs (reference/dependencies.md §2); there the DLQ path acts on the advisory and
        # deletes it. The loopback removes it here so dead work cannot fill the stream.
        self._drop(message)
        consumer = message.lane.consumer_name or ""
        self._advisories(
            max_deliveries_advisory_subject(self.name, consumer),
            {
                "type": MAX_DELIVER_ADVISORY_TYPE,
                "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
                "stream": self.name,
                "consumer": consumer,
                "stream_seq": message.seq,
                "deliveries": message.deliveries,
                "subject": message.subject,
                "item": message.item,
            },
        )

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


def _lane_key(subject: str) -> str:
    """Lane subjects share everything up to the model token; a lane filter ends in `.*` there."""
    return subject.rpartition(".")[0]
