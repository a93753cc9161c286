"""The batch former: padded-cost budget, item cap, cost sort, oversize alone, oldest-first fairness,
adaptive coalescing, the late cut while the worker is busy, and the continuous-batching driver."""

from __future__ import annotations

import asyncio
import time

import pytest

from sie.settings import BatchingSettings
from sie.sidecar.scheduler import (
    DEFAULT_MAX_BATCH_COST,
    HANDOFF_LEAD_S,
    MAX_LATE_CUT_WAIT_S,
    Batch,
    BatchFormer,
    Scheduler,
    WorkerPace,
    batch_limits,
    choose_window,
)
from sie.sidecar.work import BatchLimits, ReadyModel, Work
from sie.wire.ipc_control import ModelDescriptor
from sie.wire.queue import WorkItem
from support.polling import eventually


class _Delivery:
    def __init__(self, item: WorkItem) -> None:
        self.item = item
        self.subject = "sie.work.default.default.default.m"
        self.num_delivered = 1


def work(index: int, cost: int, received: float = 0.0, op: str = "encode", lora: str | None = None) -> Work:
    item = WorkItem(
        work_item_id=f"r{index}.0", request_id=f"r{index}", item_index=0, total_items=1, operation=op,
        model_id="m", profile_id="default", pool_name="default", machine_profile="default", router_id="gw",
        reply_subject=f"_INBOX.gw.r{index}", timestamp=0.0, options={"lora_id": lora} if lora else None,
    )  # fmt: skip
    result = Work(_Delivery(item), received)
    result.cost = cost
    return result


def model(max_cost: int = 100, max_items: int = 8) -> ReadyModel:
    return ReadyModel("m", ModelDescriptor(), BatchLimits(max_cost=max_cost, max_items=max_items))


def ids(batch: Batch) -> list[str]:
    return [w.item.request_id for w in batch.works]


# --- limits ---------------------------------------------------------------------------------------


def test_limits_come_from_the_profile_capped_by_the_setting() -> None:
    descriptor = ModelDescriptor(max_batch_tokens=8192)
    assert batch_limits(descriptor, 32, BatchingSettings()) == BatchLimits(8192, 32)
    assert batch_limits(descriptor, 32, BatchingSettings(max_batch_tokens=1000)) == BatchLimits(1000, 32)
    assert batch_limits(descriptor, None, BatchingSettings(max_batch_items=7)) == BatchLimits(8192, 7)
    assert batch_limits(None, None, BatchingSettings()).max_cost == DEFAULT_MAX_BATCH_COST


# --- the window -----------------------------------------------------------------------------------


def test_window_respects_the_padded_cost_budget() -> None:
    # longest × count <= 100: with costs 10, 20, 30, 40 from the anchor (cost 10) ...
    chosen = choose_window([10, 20, 30, 40], 0, BatchLimits(max_cost=100, max_items=8))
    assert chosen == [0, 1, 2]  # 3 × 30 = 90; adding 40 makes 4 × 40 = 160


def test_window_caps_item_count() -> None:
    assert len(choose_window([1] * 20, 0, BatchLimits(max_cost=1000, max_items=5))) == 5


def test_window_groups_similar_costs_around_the_anchor() -> None:
    # The anchor (index 0, cost 50) takes the dearest cheaper items first, so padding stays small.
    chosen = choose_window([50, 1, 48, 2, 49, 3], 0, BatchLimits(max_cost=1000, max_items=3))
    assert sorted(chosen) == [0, 2, 4]


def test_oversize_anchor_goes_alone() -> None:
    assert choose_window([500, 1, 2], 0, BatchLimits(max_cost=100, max_items=8)) == [0]


def test_oversize_item_never_joins_others() -> None:
    chosen = choose_window([5, 500, 6], 0, BatchLimits(max_cost=100, max_items=8))
    assert sorted(chosen) == [0, 2]


# --- the former -----------------------------------------------------------------------------------


def test_take_sorts_by_cost_and_charges_the_padded_cost() -> None:
    former = BatchFormer(model(max_cost=1000), max_wait_s=0.0)
    former.add([work(0, 7), work(1, 30), work(2, 3), work(3, 12)], now=0.0)
    batch = former.take(now=0.0)
    assert batch is not None
    assert [w.cost for w in batch.works] == [3, 7, 12, 30]
    assert batch.cost == 30 * 4
    assert former.count == 0 and former.take(0.0) is None


def test_oldest_item_always_goes_next() -> None:
    former = BatchFormer(model(max_cost=100, max_items=2), max_wait_s=0.0)
    former.add([work(0, 90, received=0.0)], now=0.0)
    former.add([work(i, 1, received=1.0) for i in range(1, 6)], now=1.0)
    first = former.take(now=1.0)
    assert ids(first) == ["r0"]  # oversize for two, so alone, but first: no starvation
    assert [w.cost for w in former.take(now=1.0).works] == [1, 1]


def test_operations_and_lora_keys_never_mix() -> None:
    former = BatchFormer(model(max_cost=1000), max_wait_s=0.0)
    former.add([work(0, 1, 0.0), work(1, 1, 0.1, op="score"), work(2, 1, 0.2, lora="a"), work(3, 1, 0.3)], now=0.3)
    batches = [former.take(0.3) for _ in range(3)]
    assert [(b.op, b.lora_key, ids(b)) for b in batches] == [
        ("encode", "", ["r0", "r3"]),
        ("score", "", ["r1"]),
        ("encode", "a", ["r2"]),
    ]


def test_a_lone_caller_never_waits() -> None:
    former = BatchFormer(model(), max_wait_s=0.010)
    for step in range(10):  # one item at a time, 1 ms apart: dense, but nobody else is waiting
        now = step * 0.001
        former.add([work(step, 1, received=now)], now=now)
        assert former.take(now) is not None


def test_concurrent_callers_coalesce_briefly_then_go() -> None:
    former = BatchFormer(model(max_items=16), max_wait_s=0.010)
    now = 0.0
    for step in range(20):  # bursts of 4 items 0.1 ms apart: batches of several items, dense arrivals
        now = step * 0.0001
        former.add([work(step * 4 + k, 1, received=now) for k in range(4)], now=now)
        if step % 4 == 3:
            former.take(now + 0.01)
    former.add([work(999, 1, received=now)], now=now)
    assert former.take(now, busy=True) is None  # the worker is busy and more are expected: wait a moment
    wake = former.wake_at(now, busy=True)
    assert wake is not None and now < wake <= now + 0.002 + 1e-9
    assert former.take(wake, busy=True) is not None  # the gap passed with nothing new: go


def test_an_idle_worker_never_waits_for_more() -> None:
    former = BatchFormer(model(max_items=16), max_wait_s=0.010)
    for step in range(20):  # the same dense bursts as above
        now = step * 0.0001
        former.add([work(step * 4 + k, 1, received=now) for k in range(4)], now=now)
        if step % 4 == 3:
            former.take(now + 0.01)
    former.add([work(999, 1, received=now)], now=now)
    assert former.wake_at(now, busy=False) is None
    assert former.take(now, busy=False) is not None


def test_a_full_batch_never_waits() -> None:
    former = BatchFormer(model(max_items=4), max_wait_s=0.010)
    for step in range(10):
        former.add([work(step * 4 + k, 1) for k in range(4)], now=step * 0.0001)
        assert former.take(step * 0.0001) is not None


# --- the late cut ---------------------------------------------------------------------------------


def batch_of(cost: int, sent_at: float) -> Batch:
    return Batch(model(), "encode", "", [work(0, cost)], cost, sent_at=sent_at)


def test_pace_learns_the_time_per_unit_of_cost() -> None:
    pace = WorkerPace()
    assert pace.cut_at([batch_of(100, 0.0)]) is None  # nothing finished yet: no estimate
    pace.finished(batch_of(100, 0.0), now=0.010)  # 100 units in 10 ms
    assert pace.seconds_per_cost == pytest.approx(0.0001)
    running = batch_of(200, sent_at=0.020)  # 200 units: expected to end at 40 ms
    cut = pace.cut_at([running])
    assert cut is not None and cut < 0.040 - HANDOFF_LEAD_S
    assert cut > 0.040 - HANDOFF_LEAD_S - 0.25 * 0.020


def test_a_batch_queued_behind_another_starts_when_that_one_ends() -> None:
    pace = WorkerPace()
    pace.finished(batch_of(100, 0.0), now=0.010)
    queued = batch_of(100, sent_at=0.005)  # sent while the first ran: it started at 10 ms, not 5 ms
    pace.finished(queued, now=0.020)
    assert pace.seconds_per_cost == pytest.approx(0.0001)
    first, second = batch_of(100, sent_at=0.021), batch_of(100, sent_at=0.022)  # two running, one after the other
    cut = pace.cut_at([second, first])
    assert cut is not None and 0.030 < cut < 0.041 - HANDOFF_LEAD_S


def test_a_busy_worker_fills_the_next_batch_until_the_late_cut() -> None:
    former = BatchFormer(model(max_items=16), max_wait_s=0.010)
    former.add([work(0, 1, received=0.0)], now=0.0)
    assert former.take(0.0, busy=True, cut_at=0.030) is None  # past max_wait: the worker is busy anyway
    assert former.wake_at(0.0, busy=True, cut_at=0.030) == 0.030
    former.add([work(k, 1, received=0.02) for k in range(1, 8)], now=0.02)
    batch = former.take(0.030, busy=True, cut_at=0.030)
    assert batch is not None and len(batch.works) == 8


def test_the_late_cut_never_holds_a_full_batch_or_waits_without_bound() -> None:
    former = BatchFormer(model(max_items=4), max_wait_s=0.010)
    former.add([work(k, 1) for k in range(4)], now=0.0)
    assert former.take(0.0, busy=True, cut_at=5.0) is not None  # full: goes at once
    former.add([work(9, 1, received=0.0)], now=0.0)
    assert former.wake_at(0.0, busy=True, cut_at=5.0) == MAX_LATE_CUT_WAIT_S  # a wild estimate is bounded
    assert former.take(MAX_LATE_CUT_WAIT_S, busy=True, cut_at=5.0) is not None


def test_no_wait_setting_disables_the_late_cut() -> None:
    former = BatchFormer(model(max_items=16), max_wait_s=0.0)
    former.add([work(0, 1)], now=0.0)
    assert former.take(0.0, busy=True, cut_at=1.0) is not None


# --- the driver -----------------------------------------------------------------------------------


class _SlowWorker:
    """Dispatch that blocks until released, recording batch sizes."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.release = asyncio.Event()
        self.running = 0
        self.max_running = 0

    async def dispatch(self, batch: Batch) -> None:
        self.sizes.append(len(batch.works))
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        await self.release.wait()
        self.release.clear()
        self.running -= 1


async def test_idle_model_dispatches_at_once_and_accumulates_while_busy() -> None:
    worker = _SlowWorker()
    scheduler = Scheduler(worker.dispatch, max_wait_s=0.010)
    try:
        scheduler.submit(model(max_cost=1000, max_items=64), [work(0, 1, time.monotonic())])
        await eventually(lambda: worker.sizes == [1], timeout_s=2.0, interval_s=0)  # no fixed wait when idle
        for index in range(1, 11):  # arrive while batch 1 runs
            scheduler.submit(model(max_cost=1000, max_items=64), [work(index, 1, time.monotonic())])
        await asyncio.sleep(0)
        assert worker.sizes == [1] and scheduler.pending_count() == 10
        worker.release.set()
        # The next batch forms the moment batch 1 returns.
        await eventually(lambda: worker.sizes == [1, 10], timeout_s=2.0, interval_s=0)
        assert worker.max_running == 1
        worker.release.set()
        await eventually(lambda: worker.running == 0, timeout_s=2.0, interval_s=0)
    finally:
        await scheduler.close()


@pytest.mark.parametrize("inflight", [1, 2])
async def test_inflight_batches_per_model_are_bounded(inflight: int) -> None:
    worker = _SlowWorker()
    scheduler = Scheduler(worker.dispatch, max_wait_s=0.0, max_inflight=inflight)
    try:
        for index in range(6):
            scheduler.submit(model(max_cost=1000, max_items=1), [work(index, 1)])
        await eventually(lambda: worker.running == inflight, timeout_s=2.0, interval_s=0)
        for _ in range(20):
            await asyncio.sleep(0)
        assert worker.max_running == inflight
        assert len(scheduler.waiting()) == 6
        assert len(scheduler.drain_pending()) == 6 - inflight
    finally:
        await scheduler.close()


async def test_a_batch_waiting_for_the_late_cut_goes_when_the_running_one_returns() -> None:
    worker = _SlowWorker()
    scheduler = Scheduler(worker.dispatch, max_wait_s=0.010, max_inflight=2)
    try:
        ready = model(max_cost=1000, max_items=64)
        scheduler.submit(ready, [work(0, 1, time.monotonic())])
        await eventually(lambda: worker.sizes == [1], timeout_s=2.0, interval_s=0)
        worker.release.set()  # the first batch teaches the pace: about no time per unit of cost
        await eventually(lambda: worker.running == 0, timeout_s=2.0, interval_s=0)
        scheduler.submit(ready, [work(1, 100, time.monotonic())])
        await eventually(lambda: worker.sizes == [1, 1], timeout_s=2.0, interval_s=0)
        slot = scheduler._models["m"]
        slot.pace.seconds_per_cost = 10.0  # the running batch looks long: the next one keeps filling
        for index in range(2, 6):
            scheduler.submit(ready, [work(index, 100, time.monotonic())])
        for _ in range(20):
            await asyncio.sleep(0)
        assert worker.sizes == [1, 1] and scheduler.pending_count() == 4
        worker.release.set()  # it returns early: the waiting batch goes at once, whole
        await eventually(lambda: worker.sizes == [1, 1, 4], timeout_s=2.0, interval_s=0)
        worker.release.set()
        await eventually(lambda: worker.running == 0, timeout_s=2.0, interval_s=0)
    finally:
        await scheduler.close()


async def test_a_model_on_two_replicas_sends_a_second_batch_while_the_first_runs() -> None:
    worker = _SlowWorker()
    replicas = {"m": 2}
    scheduler = Scheduler(worker.dispatch, max_wait_s=0.5, max_inflight=1, replicas=replicas.__getitem__)
    try:
        ready = model(max_cost=1000, max_items=64)
        scheduler.submit(ready, [work(0, 1, time.monotonic())])
        await eventually(lambda: worker.sizes == [1], timeout_s=2.0, interval_s=0)
        # One replica is busy, the other idle: the next arrival goes at once instead of filling a batch.
        scheduler.submit(ready, [work(1, 1, time.monotonic())])
        await eventually(lambda: worker.sizes == [1, 1], timeout_s=0.4, interval_s=0)
        # Both busy: arrivals wait for a free replica (at most max_inflight per replica run).
        scheduler.submit(ready, [work(2, 1, time.monotonic())])
        for _ in range(20):
            await asyncio.sleep(0)
        assert worker.max_running == 2 and scheduler.pending_count() == 1
        replicas["m"] = 3  # a third replica appears: the model may run one more batch at once
        scheduler.submit(ready, [work(3, 1, time.monotonic())])
        await eventually(lambda: worker.running == 3, timeout_s=2.0, interval_s=0)
    finally:
        worker.release.set()
        await scheduler.close()
