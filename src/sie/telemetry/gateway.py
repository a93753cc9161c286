"""The gateway's series: HTTP requests (`sie.telemetry.http`), admission decisions by reason, and the work queued
per lane as the broker last reported it (seed 000 §15: durable lane queue depth).

Lane values are written by a background refresh (`sie.gateway.lane_depth`) and read at collection time, so a
scrape never waits on the broker. Lane labels are pools, machine profiles and bundles that workers announced:
bounded by the deployment, never taken from a request.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Final

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from sie.telemetry.http import HttpMetrics
from sie.telemetry.metrics import ModelLabels, Tally

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


class GatewayMetrics:
    """HTTP requests (`http`, recorded by its middleware), admission decisions and per-lane queue values; `models`
    bounds the model label to the catalogue."""

    def __init__(self, meter: Meter, models: ModelLabels) -> None:
        self.http = HttpMetrics(meter, "sie.gateway", models)
        # Why requests were refused before any work was queued: provisioning is the scale-from-zero signal,
        # queue_full the overload one.
        self._admission = Tally(
            meter, "sie.gateway.admission.decisions", "{request}", "Admission decisions by outcome.", ("decision",)
        )
        self._lanes: dict[LaneKey, tuple[int, int]] = {}
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

    def set_lanes(self, depths: Mapping[LaneKey, tuple[int, int]]) -> None:
        """Replace the lane values: `(pending, ack_pending)` by lane; lanes not given stop being reported."""
        self._lanes = dict(depths)

    def _observe_depth(self, options: CallbackOptions) -> Iterable[Observation]:
        lanes = list(self._lanes.items())
        return [Observation(pending + acked, _lane_labels(lane)) for lane, (pending, acked) in lanes]

    def _observe_pending(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(pending, _lane_labels(lane)) for lane, (pending, _) in list(self._lanes.items())]


def _lane_labels(lane: LaneKey) -> dict[str, str]:
    return dict(zip(_LANE_LABELS, lane, strict=True))
