"""The pull side of one durable work consumer (a lane's, or a worker's direct-dispatch one): fetch() for every
caller on this connection, over one inbox subscription and at most one open pull request at a time (seed 000
§8.2, contracts B §4.3).

Each pull request is `no_wait` with `expires`: the server hands over what is there (up to the batch) and
ends it, or waits up to `expires` for the first message. So a fetch returns as soon as work arrives, and
nothing keeps pulling for a caller that has gone. Deliveries land in one buffer every waiting fetch takes
from; a malformed payload is NAKed here (logged) and never returned: after max_deliver JetStream advises it
and the gateway's dead letters take it, as any other dead work. Owns no stream or consumer config.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api

from sie.settings import StreamSettings
from sie.transport.base import Delivery
from sie.transport.nats.delivery import NatsDelivery
from sie.transport.nats.errors import translated
from sie.wire import DecodeError, dumps_json, from_msgpack
from sie.wire.queue import WorkItem

if TYPE_CHECKING:
    from sie.transport.nats.connection import Connection

logger = logging.getLogger(__name__)

# A pull request shorter than this is sent as a plain no_wait probe; `expires` ends it this much before the
# caller's deadline, so the server's 408 arrives before the caller leaves and no delivery is orphaned.
MIN_EXPIRES_S = 0.005
EXPIRES_MARGIN_S = 0.002
# How long a request may stay unanswered past its expiry (a lost status after a reconnect) before a new one.
REPLY_GRACE_S = 1.0
# After the server refused a pull request (409 / no consumer), the next one waits this long: no hot loop.
REFUSED_BACKOFF_S = 0.1
# At most this many messages per pull request, so one request never moves a whole backlog into one buffer.
MAX_BATCH = 1024
_ENDING_STATUSES = frozenset({"404", "408"})  # No Messages, Request Timeout
_HEARTBEAT = "100"
_NO_RESPONDERS = "503"  # nobody serves MSG.NEXT for this consumer: it is gone
_CONSUMER_DELETED = "Consumer Deleted"
_ACK_PREFIX = "$JS.ACK."

# Creates the consumer (and its stream) again after the broker lost it.
Reattach = Callable[[], Awaitable[None]]


class _PullRequest:
    """The one pull request in flight: ended by a status, a full batch, or silence past its grace."""

    __slots__ = ("token", "batch", "lingering", "delivered", "status", "give_up_at")

    def __init__(self, token: str, batch: int, lingering: bool, give_up_at: float) -> None:
        self.token = token
        self.batch = batch
        self.lingering = lingering  # has `expires`; without it the server answers at once
        self.delivered = 0
        self.status = ""
        self.give_up_at = give_up_at

    def ended(self, now: float) -> bool:
        return bool(self.status) or self.delivered >= self.batch or now > self.give_up_at


class LaneFetcher:
    """The LaneConsumer of durable `consumer` on `stream` on one connection; every `consumer(lane)` call returns the
    same object for a lane, every `worker_consumer(lane, worker)` the same for a worker. `reattach` creates the
    consumer again when the broker says it is gone."""

    def __init__(
        self, connection: Connection, stream: str, consumer: str, reattach: Reattach, settings: StreamSettings
    ) -> None:
        self.connection = connection
        self.stream = stream
        self.consumer = consumer
        self._reattach = reattach
        self._settings = settings
        self._next_subject = f"{api.DEFAULT_PREFIX}.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}"
        self._inbox = connection.client.new_inbox()
        self._tokens = itertools.count()
        self._buffer: deque[tuple[Msg, float]] = deque()
        self._wanted: dict[object, tuple[int, float]] = {}  # waiting fetches: max_items, deadline
        self._request: _PullRequest | None = None
        self._consumer_lost = False
        self._signal: asyncio.Future[None] | None = None
        self._subscription: Subscription | None = None
        self._loop = asyncio.get_running_loop()

    async def start(self) -> None:
        """Subscribe the inbox every pull request of this lane replies to."""
        with translated(f"subscribe to lane {self.consumer}"):
            self._subscription = await self.connection.client.subscribe(f"{self._inbox}.*", cb=self._on_message)

    async def fetch(self, max_items: int, timeout_s: float) -> list[Delivery]:
        """Up to `max_items` deliveries; waits at most `timeout_s` for the first one, returns [] on timeout."""
        if max_items < 1:
            raise ValueError(f"max_items must be at least 1, got {max_items}")
        self.connection.check("fetch")
        deadline = self._loop.time() + max(timeout_s, 0.0)
        key = object()
        self._wanted[key] = (max_items, deadline)
        try:
            return await self._fetch(max_items, deadline)
        finally:
            del self._wanted[key]

    async def close(self) -> None:
        """Stop receiving, wake waiting fetches (they raise TransportUnavailable), hand buffered work back."""
        self._notify()
        if self._subscription is not None and not self.connection.client.is_closed:
            with translated("unsubscribe lane"):
                await self._subscription.unsubscribe()
        buffered, self._buffer = self._buffer, deque()
        for msg, _ in buffered:
            # Fetched by nobody: a NAK lets another sidecar have it now instead of after ack_wait.
            with translated("nak on close"):
                await msg.nak()

    async def _fetch(self, max_items: int, deadline: float) -> list[Delivery]:
        mine: _PullRequest | None = None
        while True:
            self.connection.check("fetch")
            deliveries = await self._take(max_items)
            if deliveries:
                return deliveries
            now = self._loop.time()
            request = self._request
            if request is None or request.ended(now):
                if mine is not None and deadline - now <= MIN_EXPIRES_S:
                    return []
                request = mine = await self._send_request(now)
            elif now >= deadline and (request is not mine or request.lingering):
                return []
            # Past the deadline only for our own no_wait probe, whose answer is one round-trip away.
            until = request.give_up_at if deadline <= now else min(deadline, request.give_up_at)
            await self._wait(until - now)

    async def _send_request(self, now: float) -> _PullRequest:
        batch = min(MAX_BATCH, sum(wanted for wanted, _ in self._wanted.values()))
        remaining = max(deadline for _, deadline in self._wanted.values()) - now
        lingering = remaining > MIN_EXPIRES_S
        token = str(next(self._tokens))
        # Registered before any await, so the other waiting fetches see a request in flight and send none.
        self._request = request = _PullRequest(token, batch, lingering, now + max(remaining, 0.0) + REPLY_GRACE_S)
        try:
            if self._consumer_lost:
                # Deleted on the broker (by an operator, or with its stream): create it again, then pull.
                await self._reattach()
                self._consumer_lost = False
                remaining -= self._loop.time() - now
            body: dict[str, Any] = {"batch": batch, "no_wait": True}
            if lingering:
                body["expires"] = max(int((remaining - EXPIRES_MARGIN_S) * 1e9), int(MIN_EXPIRES_S * 1e9))
            with translated("fetch"):
                reply = f"{self._inbox}.{token}"
                await self.connection.client.publish(self._next_subject, dumps_json(body), reply=reply)
        except BaseException:
            request.status = "unsent"  # the next fetch sends its own
            raise
        return request

    async def _wait(self, timeout_s: float) -> None:
        if self._signal is None or self._signal.done():
            self._signal = self._loop.create_future()
        await asyncio.wait((self._signal,), timeout=max(timeout_s, 0.0))

    def _notify(self) -> None:
        if self._signal is not None and not self._signal.done():
            self._signal.set_result(None)

    async def _take(self, max_items: int) -> list[Delivery]:
        # Older than ack_wait: JetStream has redelivered it to someone else by now, so it is not ours to hand out.
        horizon = self._loop.time() - self._settings.ack_wait_s
        deliveries: list[Delivery] = []
        while self._buffer and len(deliveries) < max_items:
            msg, arrived_at = self._buffer.popleft()
            if arrived_at >= horizon:
                delivery = await self._decode(msg)
                if delivery is not None:
                    deliveries.append(delivery)
        return deliveries

    async def _decode(self, msg: Msg) -> NatsDelivery | None:
        try:
            item = from_msgpack(msg.data, WorkItem)
        except DecodeError as exc:
            num_delivered = msg.metadata.num_delivered
            logger.warning("NAK of a malformed work item on %s (delivery %d): %s", msg.subject, num_delivered, exc)
            with translated("nak"):
                await msg.nak()
            return None
        return NatsDelivery(self.connection, msg, item)

    async def _on_message(self, msg: Msg) -> None:
        if msg.reply.startswith(_ACK_PREFIX):
            self._buffer.append((msg, self._loop.time()))
            if self._request is not None:
                self._request.delivered += 1
        else:
            self._on_status(msg)
        self._notify()

    def _on_status(self, msg: Msg) -> None:
        headers = msg.headers or {}
        status = headers.get("Status", "")
        request = self._request
        if status == _HEARTBEAT or request is None or msg.subject.rpartition(".")[2] != request.token:
            return
        if status in _ENDING_STATUSES:
            request.status = status
            return
        # 409 (Consumer Deleted, Exceeded MaxWaiting, Leadership Change, ...) or 503 (no such consumer):
        # the request is over; the next one goes out after a short pause, recreating the consumer if it is gone.
        description = headers.get("Description", "")
        self._consumer_lost = status == _NO_RESPONDERS or description == _CONSUMER_DELETED
        request.give_up_at = self._loop.time() + REFUSED_BACKOFF_S
        logger.warning("pull request on %s refused: %s %s", self.consumer, status, description.strip())
