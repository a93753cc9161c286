"""The gateway's lane queue values (seed 000 §15, durable lane queue depth): a background refresh that reads each
known lane's durable consumer every REFRESH_INTERVAL_S and hands `(pending, ack_pending)` to the lane signals
(gateway/scaling.py), so a scrape or an autoscaler's read takes cached values and never waits on the broker.

Known lanes are the gateway's default lane, every lane a live worker announced and every lane with pending demand or a
pool's warm floor, at most MAX_LANES. A lane whose read fails (broker away, timeout) keeps its last value; one that
nobody announces any more is dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Final, Self

from sie.gateway.status import ModelStatusSource
from sie.runtime.periodic import FirstRun, Outage, PeriodicTask
from sie.settings import LaneSettings
from sie.telemetry.gateway import LaneKey
from sie.transport.base import Lane, LaneDepth

logger = logging.getLogger(__name__)

REFRESH_INTERVAL_S: Final = 5.0
# One refresh round never takes longer than this, whatever the broker does.
ROUND_TIMEOUT_S: Final = 4.0
MAX_LANES: Final = 1024
MAX_CONCURRENT_READS: Final = 32

ReadDepth = Callable[[Lane], Awaitable[LaneDepth]]
PublishDepths = Callable[[dict[LaneKey, tuple[int, int]]], None]


def known_lanes(
    status: ModelStatusSource, default: LaneSettings, extra: Callable[[], Iterable[LaneKey]] = lambda: ()
) -> Callable[[], list[Lane]]:
    """The default lane, the lanes of the workers `status` knows alive and the `extra` ones (lanes with pending
    demand or a warm floor: no worker may serve them yet), default first."""

    def lanes() -> list[Lane]:
        found = [Lane(default.pool, default.machine_profile, default.bundle)]
        found += [Lane(worker.pool, worker.machine_profile, worker.bundle) for worker in status.workers()]
        found += [Lane(*key) for key in extra()]
        return list(dict.fromkeys(found))[:MAX_LANES]

    return lanes


class LaneDepths:
    """`async with` reads the known lanes every `interval_s` and hands the values to `publish` until exit."""

    def __init__(
        self,
        read: ReadDepth,
        lanes: Callable[[], Iterable[Lane]],
        publish: PublishDepths,
        interval_s: float = REFRESH_INTERVAL_S,
    ) -> None:
        self._read = read
        self._lanes = lanes
        self._publish = publish
        self._values: dict[LaneKey, tuple[int, int]] = {}
        outage = Outage("refreshing the lane queue depths", logger)
        self._refreshing = PeriodicTask(self.refresh, interval_s, outage, first_run=FirstRun.AT_START)

    async def __aenter__(self) -> Self:
        await self._refreshing.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._refreshing.__aexit__(*exc_info)

    async def refresh(self) -> None:
        """One round: read every known lane (bounded in concurrency and time), then publish the values."""
        lanes = list(self._lanes())
        slots = asyncio.Semaphore(MAX_CONCURRENT_READS)

        async def one(lane: Lane) -> LaneDepth:
            async with slots:
                return await self._read(lane)

        try:
            async with asyncio.timeout(ROUND_TIMEOUT_S):
                depths = await asyncio.gather(*(one(lane) for lane in lanes), return_exceptions=True)
        except TimeoutError:
            depths = [TimeoutError()] * len(lanes)
        values: dict[LaneKey, tuple[int, int]] = {}
        for lane, depth in zip(lanes, depths, strict=True):
            key = (lane.pool, lane.machine_profile, lane.bundle)
            if isinstance(depth, LaneDepth):
                values[key] = (depth.pending, depth.ack_pending)
            elif key in self._values:  # a failed read changes nothing (seed 000 §15)
                values[key] = self._values[key]
        self._values = values
        self._publish(values)
