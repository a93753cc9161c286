"""The gateway's series: HTTP requests (`sie.telemetry.http`), admission decisions by reason and per lane, and the
lane values an autoscaler reads (seed 000 §15): durable lane queue depth as the broker last reported it, pending
demand (requests that found no worker) and the pools' warm floors.

Lane values are read at collection time from `LaneValues` (the gateway's lane signals, refreshed in the background),
so a scrape never waits on the broker. Lane labels are pools, machine profiles and bundles of workers, pools and
routed requests: bounded by the deployment and the pool store, never free text from a request.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Final, Protocol

from opentelemetry.metrics import CallbackOptions, Observation

from sie.telemetry.http import HttpMetrics
from sie.telemetry.metrics import ModelLabels, Tally, Telemetry

_LANE_LABELS: Final = ("pool", "machine_profile", "bundle")
# (pool, machine_profile, bundle)
LaneKey = tuple[str, str, str]


class AdmissionDecision(enum.StrEnum):
    """What the gateway decided about a request before publishing it (seed 000 §2 admission)."""

    ADMITTED = "admitted"
    PROVISIONING = "provisioning"  # no worker serves the lane yet (503, capacity is coming)
    QUEUE_FULL = "queue_full"  # the pool's stream is over its pending limit (503, retry)
    QUEUE_UNAVAILABLE = "queue_unavailable"  # the broker cannot be reached
    INVALID = "invalid"  # a machine profile no capacity can come for (400)


class LaneDecision(enum.StrEnum):
    """The per-lane in-flight check (seed 000 §2: always decided, shedding only when enforced)."""

    ADMITTED = "admitted"
    OVER_LIMIT = "over_limit"  # over SIE_GATEWAY_MAX_LANE_IN_FLIGHT_ITEMS, admitted (not enforced)
    SHED = "shed"  # over it and refused (503 QUEUE_FULL)


class LaneValues(Protocol):
    """Per-lane values read at collection time."""

    def depths(self) -> Mapping[LaneKey, tuple[int, int]]:
        """`(pending, ack_pending)` of each lane's durable consumer, as last read."""
        ...

    def pending_demand(self) -> Mapping[LaneKey, int]: ...

    def warm_floors(self) -> Mapping[LaneKey, int]: ...

    def pinned_models_loaded(self) -> Mapping[tuple[str, str], int]:
        """Per (pool, pinned model): 1 when a worker assigned to the pool has it loaded."""
        ...


class _NoLanes:
    def depths(self) -> Mapping[LaneKey, tuple[int, int]]:
        return {}

    def pending_demand(self) -> Mapping[LaneKey, int]:
        return {}

    def warm_floors(self) -> Mapping[LaneKey, int]:
        return {}

    def pinned_models_loaded(self) -> Mapping[tuple[str, str], int]:
        return {}


class ChunkBudgetView(Protocol):
    """What the result-chunk reservation exposes (`sie.gateway.result_chunks.ChunkBudget`)."""

    reserved_bytes: int
    rejections: Mapping[str, int]


class GatewayMetrics:
    """HTTP requests (`http`, recorded by its middleware), admission decisions, and the per-lane values of `lanes`;
    `models` bounds the model label to the catalogue."""

    def __init__(
        self,
        telemetry: Telemetry,
        models: ModelLabels,
        lanes: LaneValues | None = None,
        routing_reason: Callable[[], str | None] | None = None,
    ) -> None:
        meter = self._meter = telemetry.meter
        self.http = HttpMetrics(telemetry, "sie.gateway", models)
        self._lanes = lanes or _NoLanes()
        self._routing_reason = routing_reason or (lambda: None)
        # Whether requests can be routed now (the broker connected and the workers' first heartbeats heard): the
        # signal `/readyz` does not carry, since it is the process's readiness only (seed 000 §4).
        meter.create_observable_gauge(
            "sie.gateway.routing.ready",
            callbacks=[self._observe_routing],
            unit="1",
            description="1 while requests can be routed (broker connected, first round of worker heartbeats over).",
        )
        # Why requests were refused before any work was queued: provisioning is the scale-from-zero signal,
        # queue_full the overload one.
        self._admission = Tally(
            meter, "sie.gateway.admission.decisions", "{request}", "Admission decisions by outcome.", ("decision",)
        )
        # The stream's answer to each request's published work (seed 000 §8.2: sent without waiting, the ACKs drained
        # in the background): stored, refused (the request failed with the refusal) or cancelled (it ended first).
        self._publish_acks = Tally(
            meter, "sie.gateway.publish.acks", "{request}", "Published work by the stream's answer.", ("outcome",)
        )
        # Work items published again after a broker reconnect: their results may have been sent while it was away.
        self._republished = Tally(
            meter,
            "sie.gateway.republished.items",
            "{item}",
            "Work items published again after a broker reconnect (their results may have been lost meanwhile).",
            (),
        )
        self._republished.add((), 0)  # the series exists from the start, so increase() sees the first one
        self._lane_admission = Tally(
            meter,
            "sie.gateway.lane.admission.decisions",
            "{request}",
            "The per-lane in-flight check: admitted, over_limit (counted only) or shed.",
            (*_LANE_LABELS, "decision"),
        )
        meter.create_observable_gauge(
            "sie.gateway.lane.pending_demand",
            callbacks=[self._observe_demand],
            unit="{request}",
            description="Requests that found no worker on a lane (or were shed) and were not served since: the "
            "scale-from-zero signal.",
        )
        meter.create_observable_gauge(
            "sie.gateway.pool.warm_floor",
            callbacks=[self._observe_warm_floor],
            unit="{worker}",
            description="Workers the pools ask a lane to keep warm (the largest minimum_worker_count naming it).",
        )
        meter.create_observable_gauge(
            "sie.gateway.pool.pinned_model.loaded",
            callbacks=[self._observe_pinned],
            unit="{model}",
            description="1 when a healthy worker assigned to the pool has the pinned model loaded, else 0.",
        )
        # Work a lane holds: queued plus delivered and not yet acknowledged, so work stays visible while a
        # worker loads a model or dies before its ACK (seed 000 §15). The autoscaling input.
        meter.create_observable_gauge(
            "sie.gateway.lane.queue_depth",
            callbacks=[self._observe_depth],
            unit="{item}",
            description="Work items a lane holds: pending delivery plus delivered and unacknowledged.",
        )
        # The part not yet delivered to any worker: backlog no sidecar has taken.
        meter.create_observable_gauge(
            "sie.gateway.lane.pending",
            callbacks=[self._observe_pending],
            unit="{item}",
            description="Work items of a lane not yet delivered to a worker.",
        )

    def admission(self, decision: AdmissionDecision) -> None:
        self._admission.add((decision.value,))

    def watch_result_chunks(self, budget: ChunkBudgetView) -> None:
        """Report the result-chunk reservation `budget` at collection time (seed 000 §16.2): the bytes reserved for
        transfers in progress and the transfers refused by reason (the gateway-wide or the per-request limit)."""
        self._meter.create_observable_gauge(
            "sie.gateway.result_chunks.reserved",
            callbacks=[lambda options: [Observation(budget.reserved_bytes)]],
            unit="By",
            description="Bytes reserved for result-chunk transfers in progress.",
        )
        self._meter.create_observable_counter(
            "sie.gateway.result_chunks.rejections",
            callbacks=[lambda options: [Observation(count, {"reason": reason})
                                        for reason, count in list(budget.rejections.items())]],
            unit="{transfer}",
            description="Result-chunk transfers refused for want of reservation, by the limit they met.",
        )  # fmt: skip

    def publish_ack(self, outcome: str) -> None:
        self._publish_acks.add((outcome,))

    def republished(self, items: int) -> None:
        self._republished.add((), items)

    def lane_admission(self, lane: LaneKey, decision: LaneDecision) -> None:
        self._lane_admission.add((*lane, decision.value))

    def _observe_routing(self, options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(1 if self._routing_reason() is None else 0)

    def _observe_depth(self, options: CallbackOptions) -> Iterable[Observation]:
        lanes = list(self._lanes.depths().items())
        return [Observation(pending + acked, _lane_labels(lane)) for lane, (pending, acked) in lanes]

    def _observe_pending(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(pending, _lane_labels(lane)) for lane, (pending, _) in list(self._lanes.depths().items())]

    def _observe_demand(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(count, _lane_labels(lane)) for lane, count in self._lanes.pending_demand().items()]

    def _observe_pinned(self, options: CallbackOptions) -> Iterable[Observation]:
        values = self._lanes.pinned_models_loaded().items()
        return [Observation(loaded, {"pool": pool, "model": model}) for (pool, model), loaded in values]

    def _observe_warm_floor(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(floor, _lane_labels(lane)) for lane, floor in self._lanes.warm_floors().items()]


class OffloadOutcome(enum.StrEnum):
    """What became of a work item's payload too large for a broker message, and of its stored copy."""

    STORED = "stored"  # written to the payload store; the item travels by reference
    REFUSED = "refused"  # no store configured: the request got 413
    STORE_FAILED = "store_failed"  # the store could not be written: the request got 503
    DELETED = "deleted"  # removed once nobody waited for the request any more
    DELETE_FAILED = "delete_failed"  # left behind (the sweep or a store lifecycle rule reclaims it)
    SWEPT = "swept"  # deleted by the sweep of old payloads (a crashed gateway's)


class DeadLetterEvent(enum.StrEnum):
    """What happened to dead work (seed 000 §8.3)."""

    CAPTURED = "captured"  # work that used all its deliveries, stored as a dead letter
    CAPTURE_FAILED = "capture_failed"  # advised dead work that could not be moved
    REPLAYED = "replayed"
    DELETED = "deleted"
    PURGED = "purged"


class StoreMetrics:
    """The gateway's payload offloads (`sie.gateway.payload.offloads` by outcome) and dead letters
    (`sie.gateway.dead_letters` by event): counts the components that move work through a store add to."""

    def __init__(self, telemetry: Telemetry) -> None:
        meter = telemetry.meter
        self._offloads = Tally(meter, "sie.gateway.payload.offloads", "{item}",
                               "Work item payloads over a broker message, by outcome.", ("outcome",))  # fmt: skip
        self._letters = Tally(meter, "sie.gateway.dead_letters", "{letter}", "Dead letters by event.", ("event",))
        # Every series from zero, so `increase()` sees the first dead letter or failed store write as a step.
        for outcome in OffloadOutcome:
            self._offloads.add((outcome.value,), 0)
        for event in DeadLetterEvent:
            self._letters.add((event.value,), 0)

    def offload(self, outcome: OffloadOutcome, count: int = 1) -> None:
        self._offloads.add((outcome.value,), count)

    def dead_letter(self, event: DeadLetterEvent, count: int = 1) -> None:
        self._letters.add((event.value,), count)


class WorkerStreamMetrics:
    """`sie.gateway.worker_streams.swept`: the direct-dispatch streams of workers that are gone which this gateway's
    sweep deleted (`sie.gateway.worker_streams`). Only the gateway role sweeps, so only it declares the series."""

    def __init__(self, telemetry: Telemetry) -> None:
        # A steady rise means pods come and go under new names; none at all while they do, that nobody sweeps.
        self._swept = Tally(
            telemetry.meter,
            "sie.gateway.worker_streams.swept",
            "{stream}",
            "Direct-dispatch streams (WORK_WORKER_*) of workers that are gone, deleted by this gateway's sweep: empty "
            "and idle for longer than their max_age.",
            (),
        )
        self._swept.add((), 0)  # the series exists from the start, so increase() sees the first one

    def swept(self, count: int = 1) -> None:
        self._swept.add((), count)


def _lane_labels(lane: LaneKey) -> dict[str, str]:
    return dict(zip(_LANE_LABELS, lane, strict=True))
