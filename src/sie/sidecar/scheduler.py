"""The batch former: per model, pending work grouped by (operation, LoRA key) and cut into batches under
a padded-cost budget (longest × count, as TEI queue.rs) and an item cap; continuous batching with at
most `max_inflight` batches per model running (DESIGN §7; contracts Part B §5.1; seed 001 "Scheduling").

A batch is cut from the cost-sorted pending list as a window that always holds the oldest item, so
padding stays small and nothing starves; an item over the budget goes alone. The former is pure (it
takes `now`); `Scheduler` drives one loop task per model slot and never sleeps on the hot path.

While a batch runs, requests accumulate for the next one (DESIGN §7): the next batch is cut shortly
before the running one is expected to end (`WorkerPace`), not the moment a slot is free. The worker
runs one batch at a time, so an item gains nothing from being cut earlier: it would only wait in the
worker's queue while later arrivals wait for the batch after.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import attrs

from sie.settings import BatchingSettings
from sie.sidecar.work import BatchLimits, Channel, ReadyGroup, ReadyModel, Work
from sie.telemetry.sidecar import BatchRecord, SidecarMetrics
from sie.wire.ipc_control import ModelDescriptor

logger = logging.getLogger(__name__)

# A profile without `max_batch_tokens` gets the catalogue's usual budget.
DEFAULT_MAX_BATCH_COST: Final = 16384
# Coalescing: wait for more only while arrivals come faster than this (and never past max_batch_wait_s).
MAX_COALESCE_GAP_S: Final = 0.002
_GAP_EMA_WEIGHT: Final = 0.2
_SIZE_EMA_WEIGHT: Final = 0.2
# Coalesce only when batches have recently held at least this many items (concurrent callers).
_MIN_CONCURRENCY: Final = 2.0
# Late cut: the next batch is cut this long before the running one should end (dispatch and hand-off
# to the worker), plus a share of the running batch's expected time for the estimate's error.
HANDOFF_LEAD_S: Final = 0.003
_LEAD_SHARE: Final = 0.2
_PACE_EMA_WEIGHT: Final = 0.2
# A late cut never waits longer than this: a bad estimate cannot hold work back for long.
MAX_LATE_CUT_WAIT_S: Final = 0.5


def batch_limits(
    descriptor: ModelDescriptor | None, batch_budget: int | None, batching: BatchingSettings
) -> BatchLimits:
    """The profile's `max_batch_tokens` (capped by SIE_MAX_BATCH_TOKENS) and the worker's batch budget."""
    max_cost = (descriptor.max_batch_tokens if descriptor else None) or DEFAULT_MAX_BATCH_COST
    if batching.max_batch_tokens:
        max_cost = min(max_cost, batching.max_batch_tokens)
    max_items = batch_budget if batch_budget and batch_budget > 0 else batching.max_batch_items
    return BatchLimits(max_cost=max(1, max_cost), max_items=max(1, max_items))


def choose_window(costs: Sequence[int], anchor: int, limits: BatchLimits) -> list[int]:
    """Indices of one batch: a run of the cost-sorted items that holds `anchor`, with padded cost
    (longest × count) within budget and at most `max_items` items; `anchor` alone when it is oversize.

    It grows first towards cheaper items (the longest, hence the padding, stays put), then costlier ones.
    """
    order = sorted(range(len(costs)), key=costs.__getitem__)
    position = order.index(anchor)
    low = high = position
    longest = costs[order[position]]
    while low > 0 and high - low + 2 <= limits.max_items and (high - low + 2) * longest <= limits.max_cost:
        low -= 1
    while high + 1 < len(order) and high - low + 2 <= limits.max_items:
        wider = max(longest, costs[order[high + 1]])
        if (high - low + 2) * wider > limits.max_cost:
            break
        high, longest = high + 1, wider
    return order[low : high + 1]


@attrs.define
class Batch:
    """Work of one model, one operation and one LoRA key, sent in one RunBatch."""

    model: ReadyModel
    op: str
    lora_key: str
    works: list[Work]
    cost: int
    sent_at: float = 0.0
    inference_s: float | None = None  # the worker's model time, set by the dispatcher when the call came back


class WorkerPace:
    """When the worker will be free: its seconds per unit of batch cost (an EMA over finished batches),
    applied to the running batches in the order they were sent, since the worker runs them one by one.
    A batch's run time is measured from when it was sent, or from the end of the batch before it."""

    def __init__(self) -> None:
        self.seconds_per_cost: float | None = None
        self._last_end = 0.0

    def finished(self, batch: Batch, now: float) -> None:
        started = max(batch.sent_at, self._last_end)
        if batch.cost > 0 and now > started:
            sample = (now - started) / batch.cost
            old = self.seconds_per_cost
            self.seconds_per_cost = sample if old is None else old + _PACE_EMA_WEIGHT * (sample - old)
        self._last_end = max(self._last_end, now)

    def cut_at(self, running: Sequence[Batch]) -> float | None:
        """When to cut the next batch so it reaches the worker just as the running ones end (None: no
        estimate yet, or nothing running)."""
        if not running or self.seconds_per_cost is None:
            return None
        free_at, duration = self._last_end, 0.0
        for batch in sorted(running, key=lambda batch: batch.sent_at):
            duration = self.seconds_per_cost * batch.cost
            free_at = max(free_at, batch.sent_at) + duration
        return free_at - HANDOFF_LEAD_S - _LEAD_SHARE * duration


class BatchFormer:
    """Pending work of one model and the decision which batch goes next; pure, no I/O, no clock of its own."""

    def __init__(self, model: ReadyModel, max_wait_s: float) -> None:
        self.model = model
        self.max_wait_s = max(0.0, max_wait_s)
        self.coalesce_gap_s = min(MAX_COALESCE_GAP_S, 0.2 * self.max_wait_s)
        self._pending: dict[tuple[str, str], list[Work]] = {}
        self.count = 0
        self._last_arrival: float | None = None
        self._gap_ema: float | None = None
        # Items per batch, smoothed: 1 means one caller at a time, for whom waiting only adds latency.
        self._size_ema = 1.0

    def add(self, works: Sequence[Work], now: float) -> None:
        """Queue prepared work; arrivals also feed the inter-arrival estimate behind coalescing."""
        for work in works:
            self._pending.setdefault((work.operation, work.lora_key), []).append(work)
        self.count += len(works)
        if self._last_arrival is not None:
            # A long idle gap is clamped so a burst after it shows up as dense within a few arrivals.
            gap = min(now - self._last_arrival, max(self.max_wait_s, 5 * self.coalesce_gap_s))
            self._gap_ema = gap if self._gap_ema is None else self._gap_ema + _GAP_EMA_WEIGHT * (gap - self._gap_ema)
        self._last_arrival = now

    def take(self, now: float, busy: bool = False, cut_at: float | None = None) -> Batch | None:
        """The next batch to run now, or None (nothing pending, or worth waiting a moment for more).

        `busy`: another batch of this model is running. Only then is waiting free; an idle worker
        gets what is pending at once (waiting would leave it idle and serialise closed-loop callers).
        `cut_at`: when the running work is expected to be nearly done (`WorkerPace.cut_at`); until
        then a batch that is not full keeps filling.
        """
        key = self._oldest_key()
        if key is None:
            return None
        works = self._pending[key]
        if busy and self._wait_until(works, now, cut_at) is not None:
            return None
        chosen = choose_window([work.cost for work in works], 0, self.model.limits)
        picked = set(chosen)
        batch_works = [works[index] for index in chosen]
        rest = [work for index, work in enumerate(works) if index not in picked]
        if rest:
            self._pending[key] = rest
        else:
            del self._pending[key]
        self.count -= len(batch_works)
        self._size_ema += _SIZE_EMA_WEIGHT * (len(batch_works) - self._size_ema)
        longest = max(work.cost for work in batch_works)
        return Batch(self.model, key[0], key[1], batch_works, longest * len(batch_works))

    def wake_at(self, now: float, busy: bool = False, cut_at: float | None = None) -> float | None:
        """When a coalescing wait ends (None: no wait is running, wake on the next arrival)."""
        key = self._oldest_key()
        return None if key is None or not busy else self._wait_until(self._pending[key], now, cut_at)

    def drain(self) -> list[Work]:
        """Remove and return everything pending."""
        works = [work for group in self._pending.values() for work in group]
        self._pending.clear()
        self.count = 0
        return works

    def pending(self) -> list[Work]:
        return [work for group in self._pending.values() for work in group]

    def _full(self, works: list[Work]) -> bool:
        limits = self.model.limits
        longest = max(work.cost for work in works)
        return len(works) >= limits.max_items or longest * (len(works) + 1) > limits.max_cost

    def _oldest_key(self) -> tuple[str, str] | None:
        if not self._pending:
            return None
        return min(self._pending, key=lambda key: self._pending[key][0].received)

    def _wait_until(self, works: list[Work], now: float, cut_at: float | None) -> float | None:
        """While the worker is busy: fill until the late cut, or (no estimate yet) coalesce while several
        callers send densely; never once the batch is full or waiting is switched off."""
        if not self.max_wait_s or self._full(works):
            return None
        if cut_at is not None:
            deadline = min(cut_at, works[0].received + MAX_LATE_CUT_WAIT_S)
            return deadline if deadline > now else None
        if not self.coalesce_gap_s or self._size_ema < _MIN_CONCURRENCY:
            return None
        if self._gap_ema is None or self._gap_ema >= self.coalesce_gap_s:
            return None
        deadline = min(works[0].received + self.max_wait_s, (self._last_arrival or now) + self.coalesce_gap_s)
        return deadline if deadline > now else None


Dispatch = Callable[[Batch], Awaitable[None]]


class _ModelSlot:
    """The scheduler's state for one model: its former, the wake-up event and its loop tasks."""

    def __init__(self, former: BatchFormer) -> None:
        self.former = former
        self.pace = WorkerPace()
        self.wakeup = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.running: list[Batch] = []


class Scheduler:
    """Drives the formers: `submit` queues prepared work; per model, `max_inflight` loops per replica each
    take the next batch the moment they are free and await the dispatch (continuous batching).

    `replicas(model_id)` says how many worker children run the model at once (1 without placement): the
    model counts as busy only while every replica has a batch, and the late cut (`WorkerPace`), which
    assumes one worker running batches one by one, applies only to a single replica. `metrics` (when given)
    records each batch's shape and timings once it comes back.
    """

    def __init__(
        self,
        dispatch: Dispatch,
        max_wait_s: float,
        max_inflight: int = 1,
        clock: Callable[[], float] = time.monotonic,
        replicas: Callable[[str], int] | None = None,
        metrics: SidecarMetrics | None = None,
    ) -> None:
        self._dispatch = dispatch
        self._metrics = metrics
        self._max_wait_s = max_wait_s
        self._max_inflight = max(1, max_inflight)
        self._replicas = replicas or _one_replica
        self._models: dict[str, _ModelSlot] = {}
        self.clock = clock

    async def serve(self, inbox: Channel[ReadyGroup]) -> None:
        """The stage's intake: submit each prepared group as it arrives."""
        while True:
            model, works = await inbox.get()
            self.submit(model, works)

    def submit(self, model: ReadyModel, works: list[Work]) -> None:
        """Queue prepared work of a ready model and wake its loops; never blocks."""
        slot = self._models.get(model.model_id)
        if slot is None:
            slot = self._models[model.model_id] = _ModelSlot(BatchFormer(model, self._max_wait_s))
        self._grow(slot, model.model_id)
        slot.former.model = model  # limits follow the latest readiness answer
        slot.former.add(works, self.clock())
        slot.wakeup.set()

    def pending_count(self) -> int:
        return sum(slot.former.count for slot in self._models.values())

    def waiting(self) -> list[Work]:
        """Work queued or running (for progress ACKs of long waits)."""
        works = []
        for slot in self._models.values():
            works.extend(slot.former.pending())
            for batch in slot.running:
                works.extend(batch.works)
        return works

    def drain_pending(self) -> list[Work]:
        """Remove all queued (not running) work, to be given back."""
        works = []
        for slot in self._models.values():
            works.extend(slot.former.drain())
        return works

    async def close(self) -> None:
        tasks = [task for slot in self._models.values() for task in slot.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._models.clear()

    def _grow(self, slot: _ModelSlot, model_id: str) -> None:
        """Start loops until the model has `max_inflight` per replica (loops beyond a shrunk limit idle)."""
        loop = asyncio.get_running_loop()
        while len(slot.tasks) < self._limit(model_id):
            index = len(slot.tasks)
            slot.tasks.append(loop.create_task(self._run(slot), name=f"sie-sidecar-batch-{model_id}-{index}"))

    def _limit(self, model_id: str) -> int:
        return self._max_inflight * max(1, self._replicas(model_id))

    async def _run(self, slot: _ModelSlot) -> None:
        while True:
            now = self.clock()
            model_id = slot.former.model.model_id
            if len(slot.running) >= self._limit(model_id):
                await self._sleep_until_work(slot, None, now)  # replicas went away: this loop idles
                continue
            replicas = max(1, self._replicas(model_id))
            busy = len(slot.running) >= replicas
            cut_at = slot.pace.cut_at(slot.running) if replicas == 1 else None
            batch = slot.former.take(now, busy, cut_at)
            if batch is None:
                await self._sleep_until_work(slot, slot.former.wake_at(now, busy, cut_at), now)
                continue
            batch.sent_at = now
            slot.running.append(batch)
            sent_wall = time.time()
            try:
                await self._dispatch(batch)
            except Exception:  # noqa: BLE001 - the dispatcher settles its own failures; this is a bug guard
                logger.exception("dispatching a batch of %s failed", batch.model.model_id)
            finally:
                slot.running.remove(batch)
                slot.pace.finished(batch, self.clock())
                slot.wakeup.set()  # a loop filling the next batch cuts it now: the worker is free
            if self._metrics is not None and batch.works:
                self._metrics.batch(batch_record(batch, sent_wall, time.time() - sent_wall))

    @staticmethod
    async def _sleep_until_work(slot: _ModelSlot, wake_at: float | None, now: float) -> None:
        slot.wakeup.clear()
        if wake_at is None:
            await slot.wakeup.wait()
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wake_at - now):
                await slot.wakeup.wait()


def batch_record(batch: Batch, sent_wall: float, round_trip_s: float) -> BatchRecord:
    """What the metrics keep of a batch that came back: sent at unix time `sent_wall`, answered after `round_trip_s`."""
    limits = batch.model.limits
    fill = max(len(batch.works) / limits.max_items, batch.cost / limits.max_cost)
    oldest = min(work.item.timestamp for work in batch.works)
    return BatchRecord(
        model_id=batch.model.model_id,
        tokens=batch.cost,
        fill=min(1.0, fill),  # an oversize item goes alone, over the budget
        queue_s=max(0.0, sent_wall - oldest),
        tokenization_s=max(work.prep_ms for work in batch.works) / 1000.0,
        round_trip_s=round_trip_s,
        inference_s=batch.inference_s,
    )


def _one_replica(model_id: str) -> int:
    return 1
