"""Work nobody waits for any more (seed 001 "non-generation abandonment"; issue 13 §2): an item whose
`deadline` (absolute unix time, set by the gateway) has passed, or whose request the gateway gave up on and
announced on `work_cancel.{router_id}.{request_id}`. The stages ask `Settler.live` at each point the seed
names (on arrival, while held for a model load, before tokenization, before the worker call, before a result
is published), which ACK-drops what `Abandonment.split` removes; the counts are kept here.

Tombstones are bounded: a 100,000-entry cap evicts the oldest first, and each expires after the horizon
(the longer of the work stream's max age and the ack-wait retry window), after which no redelivery can come.
work_cancel is best effort (NATS core); a result already computed when it arrives is simply not published.

Generation has its own cancel contract (seed 001 "Generation"): `cancel.{router_id}.{request_id}`. Its tombstones
are kept apart and asked only of generate work (work_cancel never drops a generation, cancel.* never drops other
work); the generation stage also forwards the cancel to a stream already running on the worker.

Worker direct-dispatch has a third (seed 000 §8.2): `batch_cancel.{router_id}.{worker}.{request_id}`, addressed to
this worker once the gateway stored the request's direct-dispatch items on the lane as well. Its tombstones are kept
apart too and asked only of encode/score/extract work taken from this worker's own stream (a 7-token worker subject),
so the lane copies, which now answer the request, are never dropped by it. Work already on the worker runs to the
end; its result, which the gateway would ignore, is not published.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from sie.catalog.names import BATCH_CANCEL_PREFIX, GENERATE_CANCEL_PREFIX, WORK_CANCEL_PREFIX, is_work_worker_subject
from sie.sidecar.work import Work
from sie.wire.queue import OPERATION_GENERATE

logger = logging.getLogger(__name__)

CANCEL_SUBJECTS: Final = f"{WORK_CANCEL_PREFIX}.>"
GENERATE_CANCEL_SUBJECTS: Final = f"{GENERATE_CANCEL_PREFIX}.>"
MAX_TOMBSTONES: Final = 100_000


def cancel_key(subject: str, prefix: str = WORK_CANCEL_PREFIX) -> tuple[str, str] | None:
    """`(router_id, request_id)` of a `{prefix}.{router_id}.{request_id}` subject (`work_cancel` unless told, or
    `cancel` for a generation); None for any other."""
    parts = subject.split(".")
    if len(parts) != 3 or parts[0] != prefix or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


def batch_cancel_key(subject: str) -> tuple[str, str] | None:
    """`(router_id, request_id)` of a `batch_cancel.{router_id}.{worker}.{request_id}` subject; None for any other."""
    parts = subject.split(".")
    if len(parts) != 4 or parts[0] != BATCH_CANCEL_PREFIX or not all(parts):
        return None
    return parts[1], parts[3]


class Tombstones:
    """Cancelled requests by (router_id, request_id), each kept for `horizon_s`, at most `cap` of them."""

    def __init__(
        self, horizon_s: float, cap: int = MAX_TOMBSTONES, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.horizon_s = horizon_s
        self.cap = cap
        self.clock = clock
        self._expiry: collections.OrderedDict[tuple[str, str], float] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._expiry)

    def add(self, router_id: str, request_id: str) -> None:
        key = (router_id, request_id)
        self._expiry.pop(key, None)
        self._expiry[key] = self.clock() + self.horizon_s
        while len(self._expiry) > self.cap:
            self._expiry.popitem(last=False)  # the oldest goes first under sustained cancellation
        self._expire()

    def __contains__(self, key: tuple[str, str]) -> bool:
        expiry = self._expiry.get(key)
        return expiry is not None and expiry > self.clock()

    def _expire(self) -> None:
        now = self.clock()
        while self._expiry:
            key, expiry = next(iter(self._expiry.items()))
            if expiry > now:
                return
            del self._expiry[key]


def tombstone_horizon(max_age_s: float, ack_wait_s: float, max_deliver: int) -> float:
    """How long a cancelled request's work may still arrive: the longer of the stream's max age and the
    redelivery window (ack-wait × deliveries)."""
    return max(max_age_s, ack_wait_s * max(1, max_deliver))


class Abandonment:
    """Deadlines and tombstones, asked at each drop point (through `Settler.live`); counts what it removes,
    per reason. `generations` holds the cancelled generations and `fallen_back` the requests whose direct-dispatch
    items went to the lane (by default each a set like `tombstones`)."""

    def __init__(
        self,
        tombstones: Tombstones,
        wall_clock: Callable[[], float] = time.time,
        generations: Tombstones | None = None,
        fallen_back: Tombstones | None = None,
    ) -> None:
        self.tombstones = tombstones
        self.generations = generations or Tombstones(tombstones.horizon_s, tombstones.cap, tombstones.clock)
        self.fallen_back = fallen_back or Tombstones(tombstones.horizon_s, tombstones.cap, tombstones.clock)
        self.wall_clock = wall_clock
        self.dropped: collections.Counter[str] = collections.Counter()

    def reason(self, work: Work, now: float | None = None) -> str | None:
        """ "expired", "cancelled" or (direct-dispatch work the lane now answers) "fallen_back" when nobody waits for
        the work any more, else None."""
        item = work.item
        if item.deadline is not None and (self.wall_clock() if now is None else now) >= item.deadline:
            return "expired"
        generate = work.operation == OPERATION_GENERATE
        key = (item.router_id, item.request_id)
        tombstones = self.generations if generate else self.tombstones
        if tombstones and key in tombstones:
            return "cancelled"
        if self.fallen_back and not generate and key in self.fallen_back and is_direct(work):
            return "fallen_back"
        return None

    def split(self, works: Iterable[Work]) -> tuple[list[Work], list[Work]]:
        """(live, abandoned): the abandoned are counted and must be ACK-dropped by the caller."""
        now = self.wall_clock()
        live: list[Work] = []
        abandoned: list[Work] = []
        for work in works:
            reason = self.reason(work, now)
            if reason is None:
                live.append(work)
            else:
                abandoned.append(work)
                self.dropped[reason] += 1
        return live, abandoned

    async def on_cancel(self, subject: str, message: Any) -> None:
        """A `work_cancel` message: remember its request (the body is ignored; the subject says it all)."""
        key = cancel_key(subject)
        if key is None:
            logger.debug("ignoring a cancel on %r", subject)
            return
        self.tombstones.add(*key)

    async def on_batch_cancel(self, subject: str, message: Any) -> None:
        """A `batch_cancel` message (its subscription names this worker): remember its request, so its items still
        queued from this worker's own stream are dropped (the body is ignored; the subject says it all)."""
        key = batch_cancel_key(subject)
        if key is None:
            logger.debug("ignoring a batch cancel on %r", subject)
            return
        self.fallen_back.add(*key)

    def cancel_generation(self, subject: str) -> tuple[str, str] | None:
        """A `cancel` message: remember its generation, so one still queued here is dropped before it reaches the
        worker; its `(router_id, request_id)`, or None for a malformed subject."""
        key = cancel_key(subject, GENERATE_CANCEL_PREFIX)
        if key is None:
            logger.debug("ignoring a generation cancel on %r", subject)
            return None
        self.generations.add(*key)
        return key


def is_direct(work: Work) -> bool:
    """Whether `work` was taken from the worker's own direct-dispatch stream (a worker subject), not the lane."""
    return is_work_worker_subject(work.delivery.subject)
