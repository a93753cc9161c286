"""Scale-from-zero signals per lane (seed 000 §2, §15, §16.3): what an autoscaler (KEDA) reads to decide how many
workers a lane (pool, machine profile, bundle) needs.

- pending demand: requests that found no worker on the lane, or were shed, and have not been served since
  (`sie.pools.DemandTracker`; it decays when work is published to the lane or when it expires);
- queue depth: work the lane's durable consumer holds, pending plus delivered-unacknowledged (`lane_depth.py`
  writes it here every few seconds, so reads never wait on the broker);
- warm floor: the largest `minimum_worker_count` of the pools that can name the lane.

`GET /v1/scaling/lanes` and the Prometheus gauges read the same values. Pure: no I/O, no web framework.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs

from sie.gateway.status import WorkerSummary
from sie.pools import DemandTracker

# (pool, machine_profile, bundle)
LaneKey = tuple[str, str, str]
MAX_REPORTED_LANES: Final = 1024


@attrs.frozen
class LaneSignal:
    """One lane's scale signals; `demand` (pending demand plus queue depth) is what a worker count follows."""

    pool: str
    machine_profile: str
    bundle: str
    pending_demand: int = 0
    queue_depth: int = 0
    warm_floor: int = 0
    workers: int = 0

    @property
    def demand(self) -> int:
        return self.pending_demand + self.queue_depth

    def to_json(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "demand": self.demand}


class LaneSignals:
    """The gateway's lane signals: pending demand it records, queue depths its refresh writes, the pools' warm
    floors and the healthy workers per lane, read together."""

    def __init__(
        self,
        demand: DemandTracker,
        warm_floors: Callable[[], Mapping[LaneKey, int]],
        workers: Callable[[], Sequence[WorkerSummary]],
        pinned_models_loaded: Callable[[], Mapping[tuple[str, str], int]] = dict,
    ) -> None:
        self.demand = demand
        self._warm_floors = warm_floors
        self._pinned = pinned_models_loaded
        self._workers = workers
        self._depths: dict[LaneKey, tuple[int, int]] = {}

    def set_depths(self, depths: Mapping[LaneKey, tuple[int, int]]) -> None:
        """Replace the queue values: `(pending, ack_pending)` by lane; lanes not given stop being reported."""
        self._depths = dict(depths)

    def depths(self) -> Mapping[LaneKey, tuple[int, int]]:
        return self._depths

    def pending_demand(self) -> Mapping[LaneKey, int]:
        return self.demand.snapshot()

    def warm_floors(self) -> Mapping[LaneKey, int]:
        return self._warm_floors()

    def pinned_models_loaded(self) -> Mapping[tuple[str, str], int]:
        """Per (pool, pinned model), whether a worker of the pool has it loaded (1) or not (0)."""
        return self._pinned()

    def lane(self, key: LaneKey) -> LaneSignal:
        """One lane's signals; zeros for a lane nobody knows (an autoscaler still gets a value)."""
        return self._signals([key])[0]

    def lanes(self) -> list[LaneSignal]:
        """Every lane with a signal or a worker, sorted."""
        return self._signals(None)

    def _worker_counts(self) -> dict[LaneKey, int]:
        counts: dict[LaneKey, int] = {}
        for worker in self._workers():
            if worker.healthy:
                key = (worker.pool, worker.machine_profile.lower(), worker.bundle)
                counts[key] = counts.get(key, 0) + 1
        return counts

    def _signals(self, keys: Sequence[LaneKey] | None) -> list[LaneSignal]:
        """The signals of `keys`, or of every lane any value names (at most MAX_REPORTED_LANES), each read once."""
        demand, floors, workers = self.demand.snapshot(), self._warm_floors(), self._worker_counts()
        if keys is None:
            keys = sorted({*self._depths, *demand, *floors, *workers})[:MAX_REPORTED_LANES]
        signals = []
        for key in keys:
            pending, acked = self._depths.get(key, (0, 0))
            signals.append(
                LaneSignal(
                    *key,
                    pending_demand=demand.get(key, 0),
                    queue_depth=pending + acked,
                    warm_floor=floors.get(key, 0),
                    workers=workers.get(key, 0),
                )
            )
        return signals
