"""Admission: how many work items the sidecar holds per model, decided before any tokenization (STYLE
habit 9). It counts items from admission to settlement, tells the consumer how much it may fetch, and knows
which items it holds (the keepalive progress-ACKs those held long, but not a generation stream already settled
while it runs). It never settles anything itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Final

from sie.sidecar.work import Work
from sie.telemetry.sidecar import Admission as Decision
from sie.telemetry.sidecar import SidecarMetrics

# A refused item comes back soon, possibly to a less busy sidecar (contracts Part B §4.3: 0.1 s).
ADMISSION_NAK_DELAY_S: Final = 0.1


class Admission:
    """Per-model pending counts with a cap; the lane-wide total bounds what one fetch may take; `metrics` (when
    given) counts the items admitted and refused."""

    def __init__(
        self,
        max_pending_per_model: int,
        max_pending_total: int | None = None,
        metrics: SidecarMetrics | None = None,
    ) -> None:
        self._metrics = metrics
        self.max_per_model = max_pending_per_model
        self.max_total = max_pending_total or max_pending_per_model
        self._pending: dict[str, int] = {}
        self._held: set[Work] = set()
        self.total = 0
        self._capacity = asyncio.Event()
        self._capacity.set()
        self._idle = asyncio.Event()
        self._idle.set()

    def pending(self, model_id: str) -> int:
        return self._pending.get(model_id, 0)

    def free(self) -> int:
        """How many more items the lane may take in now (the fetch size bound)."""
        return max(0, self.max_total - self.total)

    def admit(self, model_id: str, works: Sequence[Work]) -> tuple[list[Work], list[Work]]:
        """Split `works` of one model into admitted and refused (to be NAKed); admitted ones count."""
        room = max(0, self.max_per_model - self._pending.get(model_id, 0))
        admitted, refused = list(works[:room]), list(works[room:])
        if self._metrics is not None:
            self._metrics.admission(Decision.ADMITTED, len(admitted))
            self._metrics.admission(Decision.REFUSED, len(refused))
        for work in admitted:
            work.admitted = True
        self._held.update(admitted)
        if admitted:
            self._pending[model_id] = self._pending.get(model_id, 0) + len(admitted)
            self.total += len(admitted)
            self._idle.clear()
            if self.total >= self.max_total:
                self._capacity.clear()
        return admitted, refused

    def release(self, works: Iterable[Work]) -> None:
        """Settled (or given up) work frees its slot; releasing twice is harmless."""
        for work in works:
            if not work.admitted:
                continue
            work.admitted = False
            self._held.discard(work)
            left = self._pending.get(work.model_id, 0) - 1
            if left > 0:
                self._pending[work.model_id] = left
            else:
                self._pending.pop(work.model_id, None)
            self.total -= 1
        if self.total < self.max_total:
            self._capacity.set()
        if self.total <= 0:
            self.total = 0
            self._idle.set()

    def settled(self, works: Iterable[Work]) -> None:
        """Work already ACKed or NAKed that still runs (a generation stream): it keeps its slot until released, but
        leaves `held()`, since a settled delivery has no ack-wait left to restart."""
        self._held.difference_update(works)

    def held(self) -> list[Work]:
        """Every admitted item not yet released nor settled, wherever it waits or runs."""
        return list(self._held)

    async def wait_capacity(self) -> None:
        await self._capacity.wait()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is pending; False when `timeout_s` passed first."""
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True
