"""One lane's durable consumer inside a loopback pool stream: its ready queues and its waiting fetchers.

A LaneQueue only orders messages and wakes fetchers; PoolStream decides delivery, timers and settlement.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sie.transport.loopback.delivery import LoopbackDelivery
    from sie.wire.queue import WorkItem

# Message states: READY sits in a lane deque, DELIVERED waits for settlement or ack-wait,
# DELAYED waits for its nak delay, REMOVED is gone from the stream (acked, termed, expired, dead).
READY, DELIVERED, DELAYED, REMOVED = range(4)

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


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)
