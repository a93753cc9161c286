"""Settlement of deliveries (seed 001 "Request Flow"; contracts Part B §4.3): which verdict a delivery
gets, and the one place that publishes replies, flushes, then ACKs or NAKs. No stage settles by itself.

Rules: an unsafe reply subject (not `_INBOX.`) is ACK-dropped; a malformed work subject is NAKed; a reply
is published and flushed before its ACK; a failed publish or flush leaves the message unsettled (it is
redelivered after ack-wait); a transient backend failure is NAKed with its delay.

A generation stream is settled while it still runs (sie.wire.generate): its chunks are published as they come,
flushed before its ACK, and the work keeps its admission slot until `release` at the stream's end.
"""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Final

import attrs

from sie.catalog.names import INBOX_PREFIX, LANE_SUBJECT_TOKENS, WORK_SUBJECT_PREFIX, WORKER_SUBJECT_TOKENS
from sie.sidecar.abandonment import Abandonment, is_direct
from sie.sidecar.admission import Admission
from sie.sidecar.publishing import ResultPublisher
from sie.sidecar.work import Work
from sie.transport.base import MessageBus
from sie.wire.generate import GenerateChunk
from sie.wire.ipc_batch import (
    DISPOSITION_NAK_RETRY,
    DISPOSITION_PUBLISH_AND_ACK,
    DISPOSITION_PUBLISH_ERROR_AND_ACK,
    ItemOutcome,
)
from sie.wire.queue import WorkResult

logger = logging.getLogger(__name__)

_INBOX: Final = INBOX_PREFIX + "."
_WORK_PREFIX: Final = WORK_SUBJECT_PREFIX + "."
# `_INBOX.` then one or more non-empty tokens free of wildcards and whitespace.
_SAFE_REPLY: Final = re.compile(re.escape(_INBOX) + r"[^.*>\s]+(?:\.[^.*>\s]+)*")


class Verdict(enum.Enum):
    """What to do with a delivery before any work is spent on it."""

    ACCEPT = "accept"
    ACK_DROP = "ack_drop"
    NAK = "nak"


def is_safe_reply_subject(subject: str) -> bool:
    """A concrete `_INBOX.…` subject with no wildcard or whitespace (anything else could publish anywhere)."""
    return _SAFE_REPLY.fullmatch(subject) is not None


def is_work_subject(subject: str) -> bool:
    """`sie.work.{pool}.{machine_profile}.{bundle}.{model}`, six non-empty tokens, or the same with the worker
    after the model (worker direct-dispatch, seed 000 §8.2), seven."""
    if not subject.startswith(_WORK_PREFIX):
        return False
    tokens = subject.split(".")
    return len(tokens) in (LANE_SUBJECT_TOKENS, WORKER_SUBJECT_TOKENS) and all(tokens)


def verdict(subject: str, reply_subject: str) -> Verdict:
    """Unsafe reply subject: ACK-drop (nobody may be answered); malformed work subject: NAK."""
    if not is_safe_reply_subject(reply_subject):
        return Verdict.ACK_DROP
    if not is_work_subject(subject):
        return Verdict.NAK
    return Verdict.ACCEPT


def outcome_nak_delay(outcome: ItemOutcome) -> float | None:
    """The NAK delay in seconds for a `nak_retry` outcome (or an unknown disposition); None: publish and ACK."""
    if outcome.disposition in (DISPOSITION_PUBLISH_AND_ACK, DISPOSITION_PUBLISH_ERROR_AND_ACK):
        return None
    if outcome.disposition == DISPOSITION_NAK_RETRY:
        return max(0.0, outcome.nak_delay_ms / 1000.0)
    return 0.0


async def _settle_quietly(verb: Callable[[], Awaitable[None]], work: Work) -> None:
    try:
        await verb()
    except Exception:  # noqa: BLE001 - a settle failure must not stop the others; redelivery covers it
        logger.warning("settling %s failed", work.item.work_item_id, exc_info=True)


class Settler:
    """Publishes replies and settles deliveries; releases each settled work item's admission slot. With an
    `abandonment`, `live` ACK-drops work nobody waits for (deadline passed, request cancelled). Replies go out
    through `results`, which keeps them within the broker's message limit (whole on a bus without one)."""

    def __init__(
        self,
        bus: MessageBus,
        admission: Admission,
        abandonment: Abandonment | None = None,
        results: ResultPublisher | None = None,
    ) -> None:
        self._bus = bus
        self._admission = admission
        self._abandonment = abandonment
        self._results = results if results is not None else ResultPublisher(bus)

    async def live(self, works: list[Work]) -> list[Work]:
        """The works somebody still waits for; the abandoned ones are ACK-dropped now (one settlement path)."""
        if self._abandonment is None or not works:
            return works
        live, abandoned = self._abandonment.split(works)
        if abandoned:
            await self.ack_drop(abandoned)
        return live

    async def reply(self, replies: Sequence[tuple[Work, WorkResult]]) -> None:
        """Publish every result, flush once, then ACK what was published (a failed publish stays unacked). The
        result of work taken from the worker's own direct-dispatch stream is marked `direct_origin` (seed 000 §8.2)."""
        published: list[Work] = []
        for work, result in replies:
            if is_direct(work):
                result = attrs.evolve(result, direct_origin=True)
            try:
                await self._results.publish(work.item, result)
            except Exception:  # noqa: BLE001 - any publish failure leaves this one message for redelivery
                logger.warning("publishing the result of %s failed; left unacked", work.item.work_item_id,
                               exc_info=True)  # fmt: skip
            else:
                published.append(work)
        if published and not await self._flush():
            published = []
        for work in published:
            await _settle_quietly(work.delivery.ack, work)
        self._admission.release(work for work, _ in replies)

    async def nak(self, works: Iterable[Work], delay_s: float) -> None:
        """Give work back for redelivery after `delay_s` (counts toward max_deliver)."""
        works = list(works)
        for work in works:
            await _settle_quietly(lambda work=work: work.delivery.nak(delay_s), work)
        self._admission.release(works)

    async def ack_drop(self, works: Iterable[Work]) -> None:
        """Remove work without answering it (unsafe reply subject, abandoned work)."""
        works = list(works)
        for work in works:
            await _settle_quietly(work.delivery.ack, work)
        self._admission.release(works)

    async def in_progress(self, works: Iterable[Work], now: float) -> None:
        """Progress-ACK: restart the ack-wait timers of work that is still being handled."""
        for work in works:
            work.progressed = now
            await _settle_quietly(work.delivery.in_progress, work)

    async def publish_chunk(self, subject: str, chunk: GenerateChunk) -> None:
        """Send one chunk of a generation stream; raises what the bus raises (the stream then fails)."""
        await self._bus.publish_result(subject, chunk)

    async def ack_stream(self, work: Work) -> bool:
        """Flush the chunks published so far, then ACK a running generation (never redelivered from here); it keeps
        its slot. False, and left unacked, when the flush failed."""
        if not await self._flush():
            return False
        await _settle_quietly(work.delivery.ack, work)
        self._admission.settled([work])
        return True

    async def nak_stream(self, work: Work, delay_s: float) -> None:
        """Give a generation back for redelivery after `delay_s`; it keeps its slot until its stream ends."""
        await _settle_quietly(lambda: work.delivery.nak(delay_s), work)
        self._admission.settled([work])

    async def flush(self) -> bool:
        """Flush what was published; False when that failed (logged)."""
        return await self._flush()

    def release(self, works: Iterable[Work]) -> None:
        """Free the slots of work whose stream ended (settled by `ack_stream` / `nak_stream`, or left for
        redelivery)."""
        self._admission.release(works)

    async def _flush(self) -> bool:
        try:
            await self._bus.flush()
        except Exception:  # noqa: BLE001 - without the broker's barrier no ACK may go out
            logger.warning("flushing replies failed; their messages stay unacked", exc_info=True)
            return False
        return True
