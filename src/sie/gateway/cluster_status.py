"""The cluster snapshot pushed on `GET /ws/cluster-status` (seed 000 §14) and drawn by the status page: the SDK's
ClusterStatusMessage `{timestamp, cluster, workers, models}` (contracts Part B §2.4, the `/health` fields), plus
`status`, `queue` (work items per pool stream, requests waiting at this gateway) and `traffic` (per-second requests
and latency of the last minutes). Reads only in-memory state and the transport's cached stream depths.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Final

import attrs

from sie.gateway.models import health_body
from sie.gateway.router import CatalogSource
from sie.gateway.status import ModelStatusSource
from sie.gateway.traffic import TrafficWindow
from sie.transport.base import TransportError, WorkQueue

# Clients connected at once share one snapshot this young instead of each asking the broker for depths.
REUSE_SNAPSHOT_S: Final = 0.5
# A pool whose depth the broker does not give within this long shows none (null) in this snapshot.
DEPTH_TIMEOUT_S: Final = 1.0


@attrs.frozen
class ClusterSources:
    """What a snapshot is read from."""

    catalog: CatalogSource
    status: ModelStatusSource  # workers and model states
    queue: WorkQueue  # pool stream depths
    waiting_requests: Callable[[], int]  # requests at this gateway waiting for results
    default_pool: str  # the pool requests go to when their headers name none
    configured_gpus: tuple[str, ...] = ()


class ClusterStatus:
    """Builds snapshots; one built within REUSE_SNAPSHOT_S is handed out again."""

    def __init__(
        self, sources: ClusterSources, traffic: TrafficWindow, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._sources = sources
        self._traffic = traffic
        self._clock = clock
        self._last: dict[str, Any] | None = None
        self._last_at = 0.0

    async def snapshot(self) -> dict[str, Any]:
        """The current picture of the cluster as JSON-able data."""
        now = self._clock()
        if self._last is not None and now - self._last_at < REUSE_SNAPSHOT_S:
            return self._last
        sources = self._sources
        health = health_body(sources.catalog(), sources.status, sources.configured_gpus)
        traffic = self._traffic.series()
        health["cluster"]["total_qps"] = round(traffic.requests_per_s(), 3)
        pools = sorted({sources.default_pool, *(worker["pool_name"] for worker in health["workers"])})
        self._last = {
            "timestamp": time.time(),
            **health,
            "queue": {"pools": await self._depths(pools), "waiting_requests": sources.waiting_requests()},
            "traffic": traffic.to_dict(),
        }
        self._last_at = now
        return self._last

    async def _depths(self, pools: list[str]) -> dict[str, int | None]:
        return dict(zip(pools, await asyncio.gather(*(self._depth(pool) for pool in pools)), strict=True))

    async def _depth(self, pool: str) -> int | None:
        try:
            async with asyncio.timeout(DEPTH_TIMEOUT_S):
                return await self._sources.queue.pending(pool)
        except (TransportError, TimeoutError):
            return None  # broker not connected or slow: the page shows the depth as unknown
