"""The gateway's worker registry (seed 000 §6, §8.1 "Worker health"): the latest `sie.health.>` heartbeat per
worker, last-heartbeat-wins, and the ModelStatusSource that `/v1/models` and `/health` read from it.
Healthy means ready, not draining and heard from within `worker_stale_s`. Reads never block or do I/O. While the
broker is not connected (`unavailable` names why) no heartbeat can arrive: `has_consumer` raises TransportUnavailable
instead of calling every lane unserved.

`has_consumer` (admission: PROVISIONING when False) asks a little less than healthy: a worker heard ready within
`worker_stale_s` serves its lane even while it says not ready (its backend restarting), and a registry that has only
just started listening waits out its first round of heartbeats for the lane's before calling it unserved. So a
worker or gateway restart is not answered as a scale-from-zero with its 60 s Retry-After (issue 13 §4).

`routing_reason` says why requests cannot be routed on the registry yet: the bus cannot deliver heartbeats, or that
first round is not over (`/health` shows it; `/readyz` is the process's readiness only, seed 000 §4). A request
arriving meanwhile is not refused for it: admission raises TransportUnavailable (a retryable 503) while the bus is
down, and waits out the first round for its lane's heartbeats.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Self

import attrs

from sie.catalog.names import HEALTH_WILDCARD
from sie.gateway.status import (
    STATE_AVAILABLE,
    STATE_FAILED,
    STATE_LOADED,
    STATE_LOADING,
    LastError,
    WorkerSummary,
)
from sie.transport.base import Lane, MessageBus, Subscription, TransportUnavailable
from sie.wire.health import ModelFailure, WorkerHeartbeat
from sie.wire.ipc_control import ModelResidency

logger = logging.getLogger(__name__)

# A worker silent for this many stale periods is forgotten (until then `/health` lists it as unhealthy).
PRUNE_AFTER_STALE_PERIODS: Final = 6.0
# A sidecar beats every SIE_HEALTH_INTERVAL_S, or later by as long as its ping to the worker takes (it gives up after
# two intervals): a registry that has listened this many intervals has heard every live worker at least once.
FIRST_ROUND_INTERVALS: Final = 2.5
# The first round with the default 1 s interval.
FIRST_HEARTBEAT_WAIT_S: Final = FIRST_ROUND_INTERVALS * 1.0

# Why the bus cannot deliver heartbeats now, or None while it can.
UnavailableReason = Callable[[], str | None]


def first_heartbeat_round_s(heartbeat_interval_s: float) -> float:
    """How long a registry listens before it has heard every live worker whose sidecar beats at this interval."""
    return FIRST_ROUND_INTERVALS * heartbeat_interval_s


@attrs.frozen
class Eligibility:
    """Which workers may take a lane's work: on the lane (machine profile in any case), holding the expected
    `bundle_config_hash` when both sides know one, and among `workers` when given."""

    lane: Lane
    bundle_config_hash: str = ""
    workers: frozenset[str] | None = None

    def admits(self, heartbeat: WorkerHeartbeat) -> bool:
        lane = self.lane
        if heartbeat.pool != lane.pool or heartbeat.bundle != lane.bundle:
            return False
        if heartbeat.machine_profile.casefold() != lane.machine_profile.casefold():
            return False
        expected, held = self.bundle_config_hash, heartbeat.bundle_config_hash
        if expected and held and held != expected:
            return False
        return self.workers is None or heartbeat.worker_id in self.workers


@attrs.frozen
class RegisteredWorker:
    """One worker's latest heartbeat, when this gateway received it, and its model sets for O(1) lookups."""

    heartbeat: WorkerHeartbeat
    received_at: float
    loaded: frozenset[str]
    loading: frozenset[str]
    # model id -> when this gateway first saw the failure as it is now (ModelFailure carries no time).
    failures_seen: Mapping[str, float]
    ready_at: float | None = None  # when this gateway last heard it ready (None: never)


class WorkerRegistry:
    """Subscribes to `sie.health.>` inside `async with`; every query is O(workers) over the last heartbeats."""

    def __init__(
        self,
        bus: MessageBus,
        stale_s: float,
        prune_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        unavailable: UnavailableReason | None = None,
        first_heartbeat_wait_s: float = FIRST_HEARTBEAT_WAIT_S,
    ) -> None:
        if stale_s <= 0:
            raise ValueError(f"worker stale time must be positive, got {stale_s!r} (SIE_GATEWAY_WORKER_STALE_S)")
        self.bus = bus
        self.stale_s = stale_s
        self.prune_after_s = prune_after_s if prune_after_s is not None else PRUNE_AFTER_STALE_PERIODS * stale_s
        self.clock = clock
        self._unavailable = unavailable
        self.first_heartbeat_wait_s = first_heartbeat_wait_s
        self._workers: dict[str, RegisteredWorker] = {}
        self._subscription: Subscription | None = None
        self._last_prune = -math.inf
        self._listening_since: float | None = None  # since when heartbeats could arrive
        self._beat: asyncio.Future[None] | None = None  # resolved by the next heartbeat

    async def __aenter__(self) -> Self:
        self._subscription = await self.bus.subscribe(HEALTH_WILDCARD, self._on_message, message_type=WorkerHeartbeat)
        if self._unavailable is None or self._unavailable() is None:
            self._listening_since = self.clock()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            await subscription.unsubscribe()

    # Updates

    def observe(self, heartbeat: WorkerHeartbeat) -> bool:
        """Record one heartbeat; False when an older-stamped one arrives while the newer is still fresh."""
        now = self.clock()
        previous = self._workers.get(heartbeat.worker_id)
        if previous is not None and self._out_of_order(previous, heartbeat, now):
            return False
        self._workers[heartbeat.worker_id] = _register(heartbeat, now, previous)
        if self._listening_since is None:  # heartbeats arrive: the first round has begun, at the latest now
            self._listening_since = now
        if now - self._last_prune >= self.stale_s:
            self.prune()
        if self._beat is not None and not self._beat.done():
            self._beat.set_result(None)
        return True

    def _out_of_order(self, previous: RegisteredWorker, heartbeat: WorkerHeartbeat, now: float) -> bool:
        """Last heartbeat wins: an older-stamped one loses while the newer is fresh (a restarted worker
        whose clock went back is accepted once its old record went stale)."""
        older = heartbeat.timestamp < previous.heartbeat.timestamp
        return older and now - previous.received_at <= self.stale_s

    def prune(self) -> int:
        """Forget workers silent for longer than `prune_after_s`; returns how many went."""
        now = self._last_prune = self.clock()
        dead = [key for key, record in self._workers.items() if now - record.received_at > self.prune_after_s]
        for key in dead:
            del self._workers[key]
        return len(dead)

    def _on_message(self, subject: str, message: Any) -> None:
        if isinstance(message, WorkerHeartbeat):
            self.observe(message)
        else:
            logger.debug("ignoring a non-heartbeat message on %s: %r", subject, type(message))

    # Queries

    def is_healthy(self, record: RegisteredWorker, now: float | None = None) -> bool:
        """Ready, not draining, and heard from within `stale_s`."""
        now = self.clock() if now is None else now
        heartbeat = record.heartbeat
        return heartbeat.ready and not heartbeat.draining and now - record.received_at <= self.stale_s

    def status(self, model_id: str) -> tuple[str, LastError | None]:
        """State over healthy workers by precedence loading > unloading > loaded > failed > available
        (contracts Part B §1.6); `last_error` is the newest failure any healthy worker reports."""
        loading = loaded = False
        newest: tuple[float, ModelFailure] | None = None
        for record in self._healthy():
            loading = loading or model_id in record.loading
            loaded = loaded or model_id in record.loaded
            failure = record.heartbeat.failed_models.get(model_id)
            seen = record.failures_seen.get(model_id, -math.inf)
            if failure is not None and (newest is None or seen > newest[0]):
                newest = (seen, failure)
        last_error = _last_error(newest[1]) if newest is not None else None
        if loading:
            return STATE_LOADING, last_error
        if loaded:
            return STATE_LOADED, None
        if last_error is not None:
            return STATE_FAILED, last_error
        return STATE_AVAILABLE, None

    def residency(self, model_id: str) -> Sequence[ModelResidency]:
        """Where healthy workers report the model loaded, by worker (workers that report no residency are left out)."""
        reported = (entry for record in self._healthy() for entry in record.heartbeat.residency or ())
        return sorted((entry for entry in reported if entry.model_id == model_id), key=lambda entry: entry.worker)

    def workers(self) -> Sequence[WorkerSummary]:
        """Every worker heard from within `prune_after_s`, healthy or not, by name."""
        now = self.clock()
        records = sorted(self._workers.values(), key=lambda record: record.heartbeat.worker_id)
        return [
            _summary(record, self.is_healthy(record, now))
            for record in records
            if now - record.received_at <= self.prune_after_s
        ]

    def live_worker_ids(self) -> frozenset[str] | None:
        """The ids of every worker heard from within `prune_after_s`, healthy or not; None while the registry cannot
        know them all: the bus cannot deliver heartbeats, or their first round is not over (see `routing_reason`)."""
        if self.routing_reason() is not None:
            return None
        now = self.clock()
        return frozenset(
            worker_id for worker_id, record in self._workers.items() if now - record.received_at <= self.prune_after_s
        )

    def healthy_workers(
        self, pool: str | None = None, machine_profile: str | None = None, bundle: str | None = None
    ) -> list[WorkerHeartbeat]:
        """Healthy workers' heartbeats, filtered by pool and bundle (exact) and machine profile (any case);
        None matches anything."""
        profile = machine_profile.casefold() if machine_profile is not None else None
        return [
            record.heartbeat
            for record in self._healthy()
            if (pool is None or record.heartbeat.pool == pool)
            and (bundle is None or record.heartbeat.bundle == bundle)
            and (profile is None or record.heartbeat.machine_profile.casefold() == profile)
        ]

    async def has_consumer(
        self, lane: Lane, bundle_config_hash: str = "", workers: frozenset[str] | None = None
    ) -> bool:
        """Whether an eligible worker serves `lane` now (see `serves`): one whose `bundle_config_hash` is the
        expected one when both are known (seed 000 §2: only those are auto-routed), and one of `workers` when
        given (a capped pool's assigned workers). A JetStream durable consumer outlives the sidecars that pulled
        from it, so "is this lane served?" is a question about live workers (seed 000 §2, scale-from-zero answers
        PROVISIONING). TransportUnavailable while the bus cannot deliver heartbeats; during the first round after it
        could again, or after start, waits up to its end for the lane's heartbeats; while the lane's only workers
        hold another config, waits as long for one to apply the expected config."""
        reason = self._bus_unavailable()
        if reason is not None:
            raise TransportUnavailable(reason)
        now = self.clock()
        eligible = Eligibility(lane, bundle_config_hash, workers)
        if self._lane_served(eligible, now):
            return True
        wait_s = self._first_round_left(now)
        if bundle_config_hash and self._lane_served(Eligibility(lane, "", workers), now):
            wait_s = max(wait_s, self.first_heartbeat_wait_s)  # a config apply is on its way
        return await self._await_lane(eligible, wait_s)

    def eligible_workers(
        self, lane: Lane, bundle_config_hash: str = "", workers: frozenset[str] | None = None
    ) -> list[str]:
        """The ids of the workers that serve `lane` now and are eligible for its work (see `has_consumer`), sorted."""
        now = self.clock()
        eligible = Eligibility(lane, bundle_config_hash, workers)
        return sorted(
            worker_id
            for worker_id, record in self._workers.items()
            if eligible.admits(record.heartbeat) and self.serves(record, now)
        )

    def routing_reason(self) -> str | None:
        """Why requests cannot be routed on what the registry knows yet (`/health`'s `routing`, the routing-ready
        gauge): the bus cannot deliver heartbeats, or the first round of them since it could is not over. None after
        it, whether or not any worker was heard."""
        if self._subscription is None:
            return "not subscribed to worker heartbeats"
        reason = self._bus_unavailable()
        if reason is not None:
            return reason
        left = self._first_round_left(self.clock())
        if left > 0:
            return f"waiting {left:.1f} s more for the workers' first heartbeats"
        return None

    def _bus_unavailable(self) -> str | None:
        """Why the bus cannot deliver heartbeats now, or None; an outage seen here starts the first round over."""
        reason = self._unavailable() if self._unavailable is not None else None
        if reason is not None:
            self._listening_since = None
        return reason

    def _first_round_left(self, now: float) -> float:
        """Seconds left of the first round of heartbeats, which starts when the bus is first seen delivering them
        (called only while it is)."""
        if self._listening_since is None:
            self._listening_since = now
        return self._listening_since + self.first_heartbeat_wait_s - now

    def serves(self, record: RegisteredWorker, now: float) -> bool:
        """Not draining, and heard ready within `stale_s`: a worker whose backend restarts says not ready for a
        few seconds, and its lane's work may wait for it in the stream meanwhile."""
        ready_at = record.ready_at
        return not record.heartbeat.draining and ready_at is not None and now - ready_at <= self.stale_s

    def _lane_served(self, eligible: Eligibility, now: float) -> bool:
        return any(eligible.admits(record.heartbeat) and self.serves(record, now) for record in self._workers.values())

    async def _await_lane(self, eligible: Eligibility, wait_s: float) -> bool:
        """Wait up to `wait_s` for heartbeats that make the lane served."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while (left := deadline - loop.time()) > 0:
            if self._beat is None or self._beat.done():
                self._beat = loop.create_future()
            await asyncio.wait((self._beat,), timeout=left)
            if self._lane_served(eligible, self.clock()):
                return True
        return False

    def lanes_with_healthy_workers(self) -> frozenset[Lane]:
        """The (pool, machine profile, bundle) lanes at least one healthy worker serves."""
        return frozenset(
            Lane(record.heartbeat.pool, record.heartbeat.machine_profile, record.heartbeat.bundle)
            for record in self._healthy()
        )

    def _healthy(self) -> list[RegisteredWorker]:
        now = self.clock()
        return [record for record in self._workers.values() if self.is_healthy(record, now)]


def _register(heartbeat: WorkerHeartbeat, now: float, previous: RegisteredWorker | None) -> RegisteredWorker:
    """The new record; a failure unchanged since the previous heartbeat keeps the time it was first seen."""
    before = previous.heartbeat.failed_models if previous is not None else {}
    seen_before = previous.failures_seen if previous is not None else {}
    failures_seen = {
        model_id: seen_before.get(model_id, now) if before.get(model_id) == failure else now
        for model_id, failure in heartbeat.failed_models.items()
    }
    return RegisteredWorker(
        heartbeat=heartbeat,
        received_at=now,
        loaded=frozenset(heartbeat.loaded_models),
        loading=frozenset(heartbeat.loading_models),
        failures_seen=failures_seen,
        ready_at=now if heartbeat.ready else (previous.ready_at if previous is not None else None),
    )


def _last_error(failure: ModelFailure) -> LastError:
    return LastError(failure.error_class, failure.message, failure.attempts, failure.permanent)


def _summary(record: RegisteredWorker, healthy: bool) -> WorkerSummary:
    heartbeat = record.heartbeat
    return WorkerSummary(
        name=heartbeat.worker_id,
        pool=heartbeat.pool,
        machine_profile=heartbeat.machine_profile,
        bundle=heartbeat.bundle,
        healthy=healthy,
        gpu_count=heartbeat.device_count or 0,
        loaded_models=tuple(heartbeat.loaded_models),
    )
