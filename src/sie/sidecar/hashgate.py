"""The sidecar's hash gate (seed 000 §2, seed 001 "Live Config"): which deliveries carry a non-empty
`bundle_config_hash` other than the worker's current hash (the consumer NAKs those before any backend IPC
for them); equal or empty (legacy) hashes proceed.

Source of "the worker's current hash": the `bundle_config_hash` of the sidecar's own Ping to the worker.
It is refreshed on demand, not on a timer: while deliveries carry the cached hash no Ping is made; the
first delivery that disagrees triggers one Ping (at most one per `refresh_interval_s`) before it is judged,
so a config the worker has just applied is recognised at once. A hash never learned (the worker did not
answer yet) or an empty one (a worker that advertises none, e.g. the null backend) lets work through: the
worker's own gate (contracts Part A §2.1) refuses it there if needed.

A work whose hash matched is marked `verified_hash`; only those results echo `executed_bundle_config_hash`
(the worker's gate runs under its execution barrier, so its success means it executed exactly that hash).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from sie.ipc.client import WorkerClient
from sie.sidecar.work import Work
from sie.wire.ipc_control import PingRequest

logger = logging.getLogger(__name__)

REFRESH_INTERVAL_S: Final = 1.0


def split_by_hash(works: list[Work], current: str | None) -> tuple[list[Work], list[Work]]:
    """(proceed, refuse): refuse the works whose non-empty hash differs from a known, non-empty `current`
    hash; a proceeding work whose hash equals it is marked `verified_hash`."""
    if not current:
        return works, []
    proceed, refuse = [], []
    for work in works:
        digest = work.item.bundle_config_hash
        if digest and digest != current:
            refuse.append(work)
            continue
        work.verified_hash = digest or None
        proceed.append(work)
    return proceed, refuse


def _carries_hash(works: list[Work]) -> bool:
    return any(work.item.bundle_config_hash for work in works)


class WorkerHash:
    """The worker's current `bundle_config_hash`, as its latest successful Ping reported it."""

    def __init__(
        self,
        worker: WorkerClient,
        refresh_interval_s: float = REFRESH_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker = worker
        self.refresh_interval_s = refresh_interval_s
        self.clock = clock
        self.current: str | None = None
        self._refreshed_at: float | None = None
        self.pings = 0

    async def refresh(self) -> None:
        """Ping the worker unless that was done less than `refresh_interval_s` ago; a failure keeps the old hash."""
        now = self.clock()
        if self._refreshed_at is not None and now - self._refreshed_at < self.refresh_interval_s:
            return
        self._refreshed_at = now
        self.pings += 1
        try:
            response = await self.worker.ping(PingRequest(timestamp_ms=time.time() * 1000.0))
        except Exception:  # noqa: BLE001 - an unanswered Ping leaves the decision to the worker's gate
            logger.warning("Ping for the worker's bundle_config_hash failed", exc_info=True)
            return
        self.current = response.bundle_config_hash

    async def split(self, works: list[Work]) -> tuple[list[Work], list[Work]]:
        """(proceed, refuse) against the current hash, refreshed first when any work disagrees with it."""
        proceed, refuse = split_by_hash(works, self.current)
        if refuse or (not self.current and _carries_hash(works)):
            await self.refresh()
            proceed, refuse = split_by_hash(works, self.current)
        return proceed, refuse
