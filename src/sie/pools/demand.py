"""Pending demand per physical lane, the scale-from-zero signal (seed 000 §2, §16.3): a request that found no worker
(or was shed) records demand on its lane; only work published to that exact lane clears it; otherwise it expires
`ttl_s` after the last request that recorded it. Bounded: at most `max_lanes` lanes, with deadlines refreshed in
place, so request cardinality cannot grow it. Pure: an injected monotonic clock, no tasks.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

# (pool, machine_profile, bundle): the queue pool, not a logical pool, since KEDA scales physical lanes.
LaneKey = tuple[str, str, str]

DEFAULT_MAX_LANES = 1024


@attrs.define
class _Demand:
    count: int
    deadline: float


class DemandTracker:
    """Requests waiting for capacity, per lane; `snapshot()` is what `/v1/scaling/lanes` and the metrics read."""

    def __init__(
        self, ttl_s: float, max_lanes: int = DEFAULT_MAX_LANES, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if ttl_s <= 0 or max_lanes < 1:
            raise ValueError(f"DemandTracker needs ttl_s > 0 and max_lanes >= 1, got {ttl_s} and {max_lanes}")
        self._ttl_s = ttl_s
        self._max_lanes = max_lanes
        self._clock = clock
        self._lanes: dict[LaneKey, _Demand] = {}

    def record(self, lane_key: LaneKey) -> bool:
        """Count one request that found no worker on the lane, and restart its expiry. False when the tracker
        already holds `max_lanes` live lanes and this is not one of them (the demand is not recorded)."""
        now = self._clock()
        demand = self._lanes.get(lane_key)
        if demand is None or demand.deadline <= now:
            if demand is None and len(self._lanes) >= self._max_lanes:
                self._prune(now)
                if len(self._lanes) >= self._max_lanes:
                    return False
            demand = self._lanes[lane_key] = _Demand(0, now)
        demand.count += 1
        demand.deadline = now + self._ttl_s
        return True

    def clear(self, lane_key: LaneKey) -> None:
        """Work was published to the lane: its demand is being served."""
        self._lanes.pop(lane_key, None)

    def snapshot(self) -> dict[LaneKey, int]:
        """The live demand per lane; expired lanes are dropped here."""
        self._prune(self._clock())
        return {lane_key: demand.count for lane_key, demand in self._lanes.items()}

    def _prune(self, now: float) -> None:
        for lane_key in [key for key, demand in self._lanes.items() if demand.deadline <= now]:
            del self._lanes[lane_key]
