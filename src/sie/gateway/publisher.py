"""The gateway's side of the work queue: naming requests, admitting them against the lane's state, and
publishing their work items onto a lane subject (or one worker's own subject, falling back on the lane: worker
direct-dispatch, seed 000 §8.2), with transport failures translated into gateway errors (seed 000 §2), and announcing
the requests it gives up on. Pure asyncio; no web framework.

Admission asks two collaborators: whether anything consumes the lane (the worker registry in distributed
mode, the in-process transport in `all`) and how deep the pool's stream is (the transport, which caches what
costs a broker round trip). Nothing here caches on top of them. What it keeps itself: the work items it has in
flight per lane (per-lane backpressure) and, through the demand tracker, the lanes requests found without a worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable, Collection, Coroutine, Iterator, Sequence
from typing import Any, Final, Protocol

import attrs

from sie.catalog.names import batch_cancel_subject, generate_cancel_subject, reply_subject, work_cancel_subject
from sie.gateway.errors import InvalidRequestError, ProvisioningError, QueueFullError, QueueUnavailableError
from sie.pools import DemandTracker
from sie.telemetry.gateway import AdmissionDecision, GatewayMetrics, LaneDecision, LaneKey
from sie.transport.base import BackpressureError, Lane, NoConsumerError, Transport, TransportError, WorkQueue
from sie.wire.queue import WorkItem

logger = logging.getLogger(__name__)

# Cancel announcements in flight at once; beyond it they are skipped (best effort: deadlines still apply).
MAX_DETACHED_SENDS: Final = 1024
# How long pending demand lasts when nobody configured it (SIE_GATEWAY_DEMAND_TTL_S).
DEFAULT_DEMAND_TTL_S: Final = 300.0
# A republish the stream refuses (right after a reconnect its leader may still be elected) is tried again after
# this long, doubling up to the cap, for as long as its request waits.
REPUBLISH_RETRY_S: Final = 0.25
REPUBLISH_RETRY_MAX_S: Final = 2.0


class LaneConsumers(Protocol):
    """Whether some worker consumes a lane now (else the gateway answers PROVISIONING): one holding
    `bundle_config_hash` (when both are known; seed 000 §2: only those are eligible), and one of `workers` when given
    (a capped pool's assigned workers)."""

    async def has_consumer(
        self, lane: Lane, bundle_config_hash: str = "", workers: frozenset[str] | None = None
    ) -> bool: ...

    def eligible_workers(
        self, lane: Lane, bundle_config_hash: str = "", workers: frozenset[str] | None = None
    ) -> list[str]:
        """The ids of the eligible workers serving `lane` now (empty where workers are not addressable)."""
        ...


class QueueConsumers:
    """LaneConsumers from the work queue alone, for `--role all`: its in-process sidecar applies the catalogue the
    gateway routes with, so every consumer holds the expected config; a capped pool with no worker assigned has
    none."""

    def __init__(self, queue: WorkQueue) -> None:
        self._queue = queue

    async def has_consumer(
        self, lane: Lane, bundle_config_hash: str = "", workers: frozenset[str] | None = None
    ) -> bool:
        if workers is not None and not workers:
            return False
        return await self._queue.has_consumer(lane)

    def eligible_workers(
        self, lane: Lane, bundle_config_hash: str = "", workers: frozenset[str] | None = None
    ) -> list[str]:
        return []  # one in-process sidecar: work always goes on the lane


# The machine profiles a request may name and wait for: configured, the default lane's, and every one a worker
# was heard on. Outside them no capacity can come, so the request is refused instead of told to retry.
KnownMachineProfiles = Callable[[], Collection[str]]


@attrs.frozen
class AdmissionLimits:
    """What admission refuses by (seed 000 §2): a pool stream holding more than `max_stream_pending` work items
    (QUEUE_FULL); a lane with more than `max_lane_in_flight_items` in flight on this gateway (always counted,
    QUEUE_FULL only with `enforce_lane_limit`); a machine profile outside `known_machine_profiles` for work nobody
    serves (INVALID_INPUT: no capacity can come for it; None: any lane may be provisioned)."""

    max_stream_pending: int = 50_000
    max_lane_in_flight_items: int = 10_000
    enforce_lane_limit: bool = False
    known_machine_profiles: KnownMachineProfiles | None = None


class WorkPublisher:
    """Names requests, admits them against the lane's state and `limits`, publishes their work items and announces
    the requests it gives up on (`work_cancel`; `cancel` for a generation). `demand` records the lanes a request
    found without a worker (or was shed from) until work is published to them; `metrics` (when given) counts each
    admission decision."""

    def __init__(
        self,
        queue: Transport,
        consumers: LaneConsumers,
        router_id: str,
        limits: AdmissionLimits = AdmissionLimits(),
        metrics: GatewayMetrics | None = None,
        demand: DemandTracker | None = None,
    ) -> None:
        self._queue = queue
        self._metrics = metrics
        self._detached: set[asyncio.Task[None]] = set()  # cancel announcements, republishes, fallbacks under way
        self._consumers = consumers
        self.router_id = router_id
        self._reply_prefix = reply_subject(router_id, "")
        self._demand = demand or DemandTracker(DEFAULT_DEMAND_TTL_S)
        self._limits = limits
        self._in_flight: dict[Lane, int] = {}

    def new_request(self) -> tuple[str, str]:
        """A fresh `(request_id, reply_subject)`: a UUIDv7 (contracts Part B §4.1) and
        `_INBOX.{router_id}.{request_id}`. Unique across restarts, so a restarted gateway with the same router
        id never meets its predecessor's cancel tombstones, offloaded payload keys or late results."""
        request_id = uuid7()
        return request_id, self._reply_prefix + request_id

    async def admit(
        self,
        lane: Lane,
        items: int = 1,
        bundle_config_hash: str = "",
        workers: frozenset[str] | None = None,
        demand_lanes: Sequence[Lane] = (),
    ) -> None:
        """Refuse before publishing: no eligible consumer → PROVISIONING (demand recorded on `demand_lanes`, else
        `lane`), or INVALID_INPUT for a machine profile no capacity can come for; pool stream over its pending
        limit, or the lane over its in-flight limit while that is enforced → QUEUE_FULL (demand recorded on `lane`).
        """
        decision = AdmissionDecision.QUEUE_UNAVAILABLE  # what an unexpected failure below counts as
        try:
            await self._admit(lane, items, bundle_config_hash, workers, demand_lanes)
            decision = AdmissionDecision.ADMITTED
        except ProvisioningError:
            decision = AdmissionDecision.PROVISIONING
            raise
        except QueueFullError:
            decision = AdmissionDecision.QUEUE_FULL
            raise
        except InvalidRequestError:
            decision = AdmissionDecision.INVALID
            raise
        finally:
            if self._metrics is not None:
                self._metrics.admission(decision)

    async def _admit(
        self,
        lane: Lane,
        items: int,
        bundle_config_hash: str,
        workers: frozenset[str] | None,
        demand_lanes: Sequence[Lane],
    ) -> None:
        try:
            served = await self._consumers.has_consumer(lane, bundle_config_hash, workers)
            if not served:
                self._check_machine_profile(lane.machine_profile)
                for wanted in demand_lanes or (lane,):
                    self._demand.record(_key(wanted))
                raise ProvisioningError(
                    f"No worker serves pool '{lane.pool}', machine profile '{lane.machine_profile}', "
                    f"bundle '{lane.bundle}' yet; capacity is being provisioned"
                )
            pending = await self._queue.pending(lane.pool)
        except TransportError as exc:
            raise QueueUnavailableError(f"The work queue is unavailable: {exc}") from exc
        if pending > self._limits.max_stream_pending:
            self._demand.record(_key(lane))
            raise QueueFullError(f"Pool '{lane.pool}' has {pending} pending work items; retry later")
        self._admit_lane(lane, items)

    def _admit_lane(self, lane: Lane, items: int) -> None:
        """The per-lane check: always decided and counted, refusing only when enforced."""
        in_flight = self._in_flight.get(lane, 0)
        over = in_flight + items > self._limits.max_lane_in_flight_items and in_flight > 0
        if not over:
            decision = LaneDecision.ADMITTED
        elif self._limits.enforce_lane_limit:
            decision = LaneDecision.SHED
        else:
            decision = LaneDecision.OVER_LIMIT
        if self._metrics is not None:
            self._metrics.lane_admission(_key(lane), decision)
        if decision is LaneDecision.SHED:
            self._demand.record(_key(lane))
            raise QueueFullError(
                f"Lane {lane.pool}/{lane.machine_profile}/{lane.bundle} has {in_flight} work items in flight on this "
                "gateway; retry later"
            )

    @contextlib.contextmanager
    def in_flight(self, lane: Lane, items: int) -> Iterator[None]:
        """Count `items` as in flight on `lane` until the block ends (the request answered or abandoned)."""
        self._in_flight[lane] = self._in_flight.get(lane, 0) + items
        try:
            yield
        finally:
            left = self._in_flight[lane] - items
            if left > 0:
                self._in_flight[lane] = left
            else:
                del self._in_flight[lane]

    def _check_machine_profile(self, machine_profile: str) -> None:
        known_machine_profiles = self._limits.known_machine_profiles
        if known_machine_profiles is None:
            return
        known = sorted({profile.casefold() for profile in known_machine_profiles()})
        if machine_profile.casefold() not in known:
            raise InvalidRequestError(
                f"Machine profile '{machine_profile}' is not one this cluster has; known: {', '.join(known)} "
                "(SIE_GATEWAY_CONFIGURED_GPUS names profiles that scale from zero)",
                requested_profile=machine_profile,
                known_profiles=known,
            )

    def direct_worker(
        self, lane: Lane, request_id: str, bundle_config_hash: str, assigned: frozenset[str] | None
    ) -> str | None:
        """The worker a request goes to by worker direct-dispatch (seed 000 §8.2): one of the workers eligible now
        (of a capped pool's `assigned` ones; of the whole lane when None, for a generation), chosen by rendezvous
        hashing on the request id so requests spread over them; None when none is addressable (work then goes on
        the lane)."""
        workers = self._consumers.eligible_workers(lane, bundle_config_hash, assigned)
        if not workers:
            return None
        return max(workers, key=lambda worker: hashlib.blake2b(f"{request_id}/{worker}".encode()).digest())

    async def publish(
        self, lane: Lane, subject: str, items: Sequence[WorkItem], direct_subject: str | None = None
    ) -> asyncio.Future[None]:
        """Send every item on `subject` (a subject of `lane`), in order, without waiting for the stream to store
        them (seed 000 §8.2); the lane's pending demand is served. A refusal while sending raises here; the returned
        future completes once every item is stored, or fails with the gateway error of the refusal (see
        `publish_error`). With `direct_subject` (a worker's own stream) the items go there first, as
        `publish_direct` sends them; if that stream refuses them (the worker's stream is gone), they go on
        `subject`."""
        if direct_subject is not None:
            stored_direct = await self.publish_direct(lane, direct_subject, items)
            if stored_direct is not None:
                return stored_direct
            logger.debug("direct dispatch on %s refused; publishing on %s", direct_subject, subject)
        try:
            stored = await self._queue.submit_work_batch(subject, items)
        except TransportError as exc:
            raise publish_error(exc, subject) from exc
        self._demand.clear(_key(lane))
        if self._metrics is not None:
            stored.add_done_callback(self._count_ack)
        return stored

    async def publish_direct(
        self, lane: Lane, direct_subject: str, items: Sequence[WorkItem]
    ) -> asyncio.Future[None] | None:
        """Send every item on `direct_subject` (one worker's own stream, seed 000 §8.2) and wait for the stream to
        store them: the stored future (done) then, the lane's pending demand served; None when the stream refused
        them (it is gone, or full), for the caller to publish them on the lane instead."""
        try:
            stored = await self._queue.submit_work_batch(direct_subject, items)
            await stored
        except TransportError as exc:
            logger.debug("direct dispatch on %s refused: %s", direct_subject, exc)
            return None
        self._demand.clear(_key(lane))
        self._count_ack(stored)
        return stored

    def _count_ack(self, stored: asyncio.Future[None]) -> None:
        """Count the stream's answer to one request's published work (`sie_gateway_publish_acks_total`)."""
        if self._metrics is None:
            return
        if stored.cancelled():
            self._metrics.publish_ack("cancelled")
        else:
            self._metrics.publish_ack("refused" if stored.exception() is not None else "stored")

    def republish(self, lane: Lane, subject: str, wanted: Callable[[], Sequence[WorkItem]]) -> None:
        """Publish again on `subject` (a subject of `lane`) the work items `wanted()` names: the work of a request
        whose results may have been lost while the broker connection was down, detached. A publish the stream
        refuses is tried again (REPUBLISH_RETRY_S, doubling) while `wanted()` still names items: until the
        request is answered, fails or times out, which `wanted()` then says by naming none."""
        self._detach(self._republish_until_stored(subject, wanted), f"republish on {subject}")

    async def _republish_until_stored(self, subject: str, wanted: Callable[[], Sequence[WorkItem]]) -> None:
        delay = REPUBLISH_RETRY_S
        while items := wanted():
            try:
                await (await self._queue.submit_work_batch(subject, items))
            except TransportError as exc:
                logger.warning("publishing %d work items again on %s failed (%s); trying again in %.2f s",
                               len(items), subject, exc, delay)  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(2 * delay, REPUBLISH_RETRY_MAX_S)
            else:
                self._count_republished(len(items))
                return

    def fall_back(self, subject: str, items: Sequence[WorkItem], confirmed: Callable[[], None]) -> None:
        """Publish `items` on the lane `subject` once, detached and best effort: worker direct-dispatch work still
        unanswered after the fallback delay (seed 000 §8.2). `confirmed()` runs once the stream stored every one of
        them; a refusal is logged, and the worker may still answer within the request's timeout."""
        self._detach(self._send_detached(subject, items, confirmed), f"fall back on {subject}")

    async def _send_detached(self, subject: str, items: Sequence[WorkItem], stored: Callable[[], None]) -> None:
        """Publish `items` on `subject` and wait for the stream's ACKs; `stored()` once it took them all, a warning
        when it did not (nobody waits on a detached send)."""
        try:
            await (await self._queue.submit_work_batch(subject, items))
        except TransportError as exc:
            logger.warning("publishing %d work items again on %s failed: %s", len(items), subject, exc)
        else:
            stored()

    def _count_republished(self, items: int) -> None:
        if self._metrics is not None:
            self._metrics.republished(items)

    def cancel_direct(self, worker_id: str, request_id: str) -> None:
        """Announce `batch_cancel.{router_id}.{worker_id}.{request_id}` (NATS core, best effort, detached): the
        request's direct-dispatch items are stored on the lane now, so the worker drops those still queued on its
        own stream (seed 000 §8.2). Only after the lane stored them: a lost item must never be cancelled."""
        self._announce(batch_cancel_subject(self.router_id, worker_id, request_id), request_id)

    def abandon(self, request_id: str) -> None:
        """Announce on `work_cancel.{router_id}.{request_id}` (NATS core, best effort) that nobody waits for the
        request any more, so sidecars drop its work wherever it still waits. Detached: it never delays the
        failing request."""
        self._announce(work_cancel_subject(self.router_id, request_id), request_id)

    def cancel_generation(self, request_id: str) -> None:
        """Announce `cancel.{router_id}.{request_id}` (NATS core, best effort, detached): the sidecar forwards it to
        the worker decoding the request, which stops it (max_tokens still bounds a generation whose cancel is
        lost)."""
        self._announce(generate_cancel_subject(self.router_id, request_id), request_id)

    def _announce(self, subject: str, request_id: str) -> None:
        if len(self._detached) >= MAX_DETACHED_SENDS:
            logger.debug("cancel of %s skipped: %d sends pending", request_id, len(self._detached))
            return
        self._detach(self._send_cancel(subject, request_id), f"cancel {request_id}")

    def _detach(self, send: Coroutine[Any, Any, None], name: str) -> None:
        """Run `send` in a task of its own, referenced until it ends."""
        task = asyncio.get_running_loop().create_task(send, name=name)
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)

    async def _send_cancel(self, subject: str, request_id: str) -> None:
        try:
            await self._queue.publish(subject, {"router_id": self.router_id, "request_id": request_id})
        except Exception:  # noqa: BLE001 - best effort: deadlines and max_tokens still stop the work
            logger.debug("announcing the cancel of %s failed", request_id, exc_info=True)


def _key(lane: Lane) -> LaneKey:
    return (lane.pool, lane.machine_profile, lane.bundle)


def uuid7() -> str:
    """A UUIDv7 string (RFC 9562): 48 bits of unix milliseconds, then random bits, so ids sort by time."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10))
    value = value & ~(0xF << 76) | 0x7 << 76  # version 7
    value = value & ~(0x3 << 62) | 0x2 << 62  # variant 10
    digits = f"{value:032x}"  # what str(uuid.UUID(int=value)) writes, in a third of its time (one id per request)
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def publish_error(error: BaseException, subject: str) -> Exception:
    """The gateway error for a work publish the transport refused, while sending or when draining its ACKs."""
    if isinstance(error, BackpressureError):
        return QueueFullError(f"The work queue is full: {error}")
    if isinstance(error, NoConsumerError):
        return ProvisioningError(f"No worker consumes {subject} yet; capacity is being provisioned")
    return QueueUnavailableError(f"The work queue is unavailable: {error}")
