"""The dead-letter queue (seed 000 §8): work that used every delivery (`SIE_MAX_DELIVER`) without being settled.

JetStream keeps such a message in its work stream and advises it on `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>`;
every gateway replica hears the advisory and has the DeadLetterStore move the message into the dead letters (the
store keeps one copy however many replicas try), and the replica that stored it logs one warning naming the model
and request. An advisory sent while no gateway ran is heard by nobody, so a gateway also sweeps (the roles pass
`sweep_interval_s=SWEEP_INTERVAL_S`): on start and every interval it asks the store for spent work still in the work
streams and captures it the same way.
Operators list, show, replay, delete and purge letters here (`/v1/dlq`, `sie dlq`).

Replay is for re-driving poison work after a fix: the work item goes back to its original work subject with a
fresh request id (so the cancel its first request may have announced does not drop it), a fresh timestamp and a
deadline of now + the gateway request timeout. Nobody waits for its results: they reach the original gateway's
inbox under a request id nobody collects, and are discarded there.

Pure asyncio over the transport protocols; no web framework.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Final, Self

import attrs

from sie.catalog.names import MAX_DELIVERIES_ADVISORY, reply_subject
from sie.gateway.errors import InvalidRequestError, NotFoundError, QueueUnavailableError
from sie.gateway.publisher import publish_error
from sie.runtime.periodic import FirstRun, Outage, PeriodicTask
from sie.telemetry.gateway import DeadLetterEvent, StoreMetrics
from sie.transport.base import (
    DeadLetter,
    MaxDeliveriesAdvisory,
    Subscription,
    Transport,
    TransportError,
    TransportUnavailable,
)
from sie.wire.queue import WorkItem

logger = logging.getLogger(__name__)

MAX_LIST_LIMIT: Final = 1000
# How often spent work whose advisory nobody heard is looked for, how much of it one sweep moves, and how long ago it
# must have been queued (a younger message's advisory may still be on its way to the gateways that will capture it).
SWEEP_INTERVAL_S: Final = 60.0
SWEEP_LIMIT: Final = 1000
SWEEP_MIN_AGE_S: Final = 60.0
# While the broker cannot take the advisory subscription yet, it is tried again this often (doubling to the max).
SUBSCRIBE_RETRY_S: Final = 0.5
SUBSCRIBE_RETRY_MAX_S: Final = 10.0


@attrs.frozen
class Replayed:
    """A letter sent back to its work subject, and the work item as it was sent."""

    letter: DeadLetter
    item: WorkItem


def replay_item(item: WorkItem, letter_id: int, now: float, timeout_s: float) -> WorkItem:
    """The work item a replay sends: request `{request_id}-dlq{letter_id}`, its reply subject on the same router,
    timestamp `now`, deadline `now + timeout_s`."""
    request_id = f"{item.request_id}-dlq{letter_id}"
    return attrs.evolve(
        item,
        request_id=request_id,
        work_item_id=f"{request_id}.{item.item_index}",
        reply_subject=reply_subject(item.router_id, request_id),
        timestamp=now,
        deadline=now + timeout_s,
    )


class DeadLetterQueue:
    """Captures advised dead work into the transport's dead letters and serves the operator's verbs; an async
    context manager. `replay_timeout_s` is the gateway request timeout a replayed item's deadline gets.

    The advisory subscription is made on enter; a transport that refuses it (its broker not reachable yet) gets
    it again from a background task until it takes it. With `sweep_interval_s` a background task also sweeps for
    spent work nobody captured (on start, then every interval; work queued less than `sweep_min_age_s` ago is left
    to its advisory). `advisories` counts the advisories handled (swept ones too), `captured` the letters this
    gateway stored, `capture_failures` the advised work it could not move, `swept` the spent work a sweep found.
    """

    def __init__(
        self,
        transport: Transport,
        replay_timeout_s: float,
        clock: Callable[[], float] = time.time,
        metrics: StoreMetrics | None = None,
        sweep_interval_s: float | None = None,
        sweep_min_age_s: float = SWEEP_MIN_AGE_S,
    ) -> None:
        self._transport = transport
        self._metrics = metrics
        self._store = transport.dead_letters()
        self._replay_timeout_s = replay_timeout_s
        self._clock = clock
        self._subscription: Subscription | None = None
        self._subscribing: asyncio.Task[None] | None = None
        self.advisories = 0
        self.captured = 0
        self.capture_failures = 0
        self.swept = 0
        self._sweep_min_age_s = sweep_min_age_s
        outage = Outage("looking for spent work nobody captured", logger, (TransportError,))
        self._sweeping = (
            PeriodicTask(self.sweep, sweep_interval_s, outage, first_run=FirstRun.AT_START)
            if sweep_interval_s is not None
            else None
        )

    async def __aenter__(self) -> Self:
        if not await self._subscribe():
            self._subscribing = asyncio.create_task(self._subscribe_until_taken(), name="subscribe to advisories")
        if self._sweeping is not None:
            await self._sweeping.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._sweeping is not None:
            await self._sweeping.__aexit__(exc_type, exc, tb)
        task, self._subscribing = self._subscribing, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            with contextlib.suppress(TransportError):  # a closed broker connection has dropped it already
                await subscription.unsubscribe()

    @property
    def subscribed(self) -> bool:
        """Whether the advisory subscription is made (on a transport that defers it: recorded)."""
        return self._subscription is not None

    # operator verbs

    async def letters(self, after: int = 0, limit: int = 100) -> list[DeadLetter]:
        """Up to `limit` letters (1..MAX_LIST_LIMIT) with ids above `after`, oldest first."""
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InvalidRequestError(f"limit must be between 1 and {MAX_LIST_LIMIT}, got {limit}")
        with _store_errors():
            return await self._store.letters(after, limit)

    async def letter(self, letter_id: int) -> DeadLetter:
        """One letter; NotFoundError when there is none."""
        with _store_errors():
            letter = await self._store.get(letter_id)
        if letter is None:
            raise NotFoundError(f"No dead letter {letter_id}")
        return letter

    async def replay(self, letter_id: int) -> Replayed:
        """Send a letter's work item again (see the module docstring), then remove the letter."""
        letter = await self.letter(letter_id)
        if letter.item is None:
            raise InvalidRequestError(f"Dead letter {letter_id} does not hold a work item; it can only be deleted")
        item = replay_item(letter.item, letter_id, self._clock(), self._replay_timeout_s)
        try:
            await self._transport.publish_work(letter.subject, item)
        except TransportError as exc:
            raise publish_error(exc, letter.subject) from exc
        with _store_errors():
            await self._store.delete(letter_id)
        logger.info("dead letter %d replayed as request %s on %s", letter_id, item.request_id, letter.subject)
        self._count(DeadLetterEvent.REPLAYED)
        return Replayed(letter, item)

    async def delete(self, letter_id: int) -> None:
        """Remove one letter; NotFoundError when there is none."""
        with _store_errors():
            deleted = await self._store.delete(letter_id)
        if not deleted:
            raise NotFoundError(f"No dead letter {letter_id}")
        self._count(DeadLetterEvent.DELETED)

    async def purge(self) -> int:
        """Remove every letter; returns how many there were."""
        with _store_errors():
            purged = await self._store.purge()
        logger.info("purged %d dead letters", purged)
        self._count(DeadLetterEvent.PURGED, purged)
        return purged

    # capture

    async def sweep(self) -> None:
        """Capture the spent work the store finds still queued (its advisory was sent while no gateway ran)."""
        for advisory in await self._store.stranded(SWEEP_LIMIT, self._sweep_min_age_s):
            self.swept += 1
            await self.on_advisory("sweep", advisory)

    async def on_advisory(self, subject: str, advisory: Any) -> None:
        """A max-deliveries advisory: move the message it names into the dead letters."""
        if not isinstance(advisory, MaxDeliveriesAdvisory):
            logger.debug("ignoring %r on %s: not a max-deliveries advisory", type(advisory).__name__, subject)
            return
        try:
            letter = await self._store.capture(advisory)
        except TransportError as exc:
            self.capture_failures += 1
            self._count(DeadLetterEvent.CAPTURE_FAILED)
            logger.warning(
                "work %s #%d used all %d deliveries but was not moved to the dead letters: %s",
                advisory.stream, advisory.stream_seq, advisory.deliveries, exc,
            )  # fmt: skip
            return
        finally:
            self.advisories += 1
        if letter is not None:
            self.captured += 1
            self._count(DeadLetterEvent.CAPTURED)
            _log_letter(letter)

    def _count(self, event: DeadLetterEvent, count: int = 1) -> None:
        if self._metrics is not None and count:
            self._metrics.dead_letter(event, count)

    async def _subscribe(self) -> bool:
        try:
            self._subscription = await self._transport.subscribe(
                MAX_DELIVERIES_ADVISORY, self.on_advisory, MaxDeliveriesAdvisory
            )
        except TransportUnavailable as exc:
            logger.info("max-deliveries advisories not subscribed yet: %s", exc)
            return False
        return True

    async def _subscribe_until_taken(self) -> None:
        delay = SUBSCRIBE_RETRY_S
        while True:
            await asyncio.sleep(delay)
            if await self._subscribe():
                logger.info("subscribed to max-deliveries advisories")
                return
            delay = min(delay * 2, SUBSCRIBE_RETRY_MAX_S)


def _log_letter(letter: DeadLetter) -> None:
    item = letter.item
    model = item.model_id if item is not None else letter.subject.rpartition(".")[2]
    request = item.request_id if item is not None else "(not a work item)"
    logger.warning(
        "dead letter %d: model %s, request %s used all %d deliveries on %s (`sie dlq show %d`)",
        letter.letter_id, model, request, letter.deliveries, letter.subject, letter.letter_id,
    )  # fmt: skip


@contextlib.contextmanager
def _store_errors() -> Iterator[None]:
    """The store's transport failures as the gateway's 503 (the broker is not usable now)."""
    try:
        yield
    except TransportError as exc:
        raise QueueUnavailableError(f"The dead letters are unavailable: {exc}") from exc
