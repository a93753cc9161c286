"""The lane consumer: verdicts settle at once, unknown operations are answered, overflow beyond the
per-model cap is NAKed before any tokenization, fetches are sized by admission, and every fetch waits the same
(a fetch returns with its first delivery: a shorter wait after work would only end pull requests sooner)."""

from __future__ import annotations

import asyncio

from sie.sidecar.admission import ADMISSION_NAK_DELAY_S, Admission
from sie.sidecar.consumer import FETCH_WAIT_S, Consumer, ConsumerOptions
from sie.sidecar.hashgate import WorkerHash
from sie.sidecar.settlement import Settler
from sie.sidecar.work import Work
from sie.wire import codes
from sie.wire.ipc_control import PingRequest, PingResponse
from sie.wire.queue import WorkItem, WorkResult
from support.sidecar_fakes import RecordingDelivery as FakeDelivery


class FakeBus:
    def __init__(self, log: list) -> None:
        self._log = log
        self.results: list[WorkResult] = []

    async def publish_result(self, subject: str, result: WorkResult) -> None:
        self.results.append(result)
        self._log.append(("publish", result.work_item_id))

    async def flush(self) -> None:
        self._log.append(("flush",))


class FakeLane:
    """Hands out prepared batches of deliveries, recording each fetch's size and timeout."""

    def __init__(self, batches: list[list[FakeDelivery]]) -> None:
        self.batches = batches
        self.fetches: list[tuple[int, float]] = []

    async def fetch(self, max_items: int, timeout_s: float) -> list[FakeDelivery]:
        self.fetches.append((max_items, timeout_s))
        if self.batches:
            return self.batches.pop(0)[:max_items]
        await asyncio.sleep(0)
        return []


def item(
    index: int, model_id: str = "m", operation: str = "encode", reply: str | None = None, digest: str | None = None
) -> WorkItem:
    return WorkItem(
        work_item_id=f"r{index}.0", request_id=f"r{index}", item_index=0, total_items=1, operation=operation,
        model_id=model_id, profile_id="default", pool_name="default", machine_profile="default", router_id="gw",
        reply_subject=reply or f"_INBOX.gw.r{index}", timestamp=0.0, bundle_config_hash=digest,
    )  # fmt: skip


class Admitted(list):
    """(model, works) groups passed on to readiness; `event` is set on each."""

    def __init__(self) -> None:
        super().__init__()
        self.event = asyncio.Event()

    async def put(self, group: tuple[str, list[Work]]) -> None:
        self.append(group)
        self.event.set()


class PingWorker:
    """A worker whose Ping reports `digest` as its bundle_config_hash."""

    def __init__(self, digest: str = "") -> None:
        self.digest = digest
        self.pings = 0

    async def ping(self, request: PingRequest) -> PingResponse:
        self.pings += 1
        return PingResponse(timestamp_ms=request.timestamp_ms, worker_id="w", bundle_config_hash=self.digest)


def build(log: list, admission: Admission, lane: FakeLane | None = None, fetch_budget: int = 64, worker_hash: str = ""):
    admitted = Admitted()
    bus = FakeBus(log)
    gate = WorkerHash(PingWorker(worker_hash))
    consumer = Consumer(lane or FakeLane([]), admission, Settler(bus, admission), gate, admitted,
                        ConsumerOptions(fetch_budget, nak_delay_s=5.0, worker_id="w1"))  # fmt: skip
    return consumer, bus, admitted


async def test_verdicts_and_unknown_operations_are_settled_at_once() -> None:
    log: list = []
    consumer, bus, admitted = build(log, Admission(10))
    deliveries = [
        FakeDelivery(item(0, reply="sie.elsewhere"), log),
        FakeDelivery(item(1), log, subject="sie.work.default"),
        FakeDelivery(item(2, operation="transcribe"), log),
        FakeDelivery(item(3), log),
    ]
    await consumer.accept(deliveries)
    assert ("ack", "r0.0") in log and not any(r.work_item_id == "r0.0" for r in bus.results)
    assert ("nak", "r1.0", 5.0) in log
    assert bus.results[0].work_item_id == "r2.0" and bus.results[0].error_code == codes.INVALID_INPUT
    assert log.index(("flush",)) < log.index(("ack", "r2.0"))
    assert [(model, [w.item.work_item_id for w in works]) for model, works in admitted] == [("m", ["r3.0"])]


async def test_overflow_is_naked_before_tokenization() -> None:
    log: list = []
    admission = Admission(max_pending_per_model=2, max_pending_total=100)
    consumer, _, admitted = build(log, admission)
    await consumer.accept([FakeDelivery(item(i), log) for i in range(5)] + [FakeDelivery(item(9, "n"), log)])
    assert [len(works) for _, works in admitted] == [2, 1]  # only admitted work reaches readiness / prep
    assert sorted(entry for entry in log if entry[0] == "nak") == [
        ("nak", f"r{i}.0", ADMISSION_NAK_DELAY_S) for i in (2, 3, 4)
    ]
    assert admission.pending("m") == 2 and admission.pending("n") == 1


async def test_fetch_size_follows_admission_room() -> None:
    log: list = []
    admission = Admission(max_pending_per_model=3)
    lane = FakeLane([[FakeDelivery(item(i), log) for i in range(10)]])
    consumer, _, admitted = build(log, admission, lane, fetch_budget=64)
    task = asyncio.ensure_future(consumer.run())
    await asyncio.wait_for(admitted.event.wait(), 2.0)
    consumer.stop()
    admission.release(admitted[0][1])  # wake the loop if it waits for room
    await asyncio.wait_for(task, 2.0)
    assert lane.fetches[0][0] == 3  # never more than the room left
    assert len(admitted[0][1]) == 3 and not any(entry[0] == "nak" for entry in log)


async def test_every_fetch_waits_the_same_right_after_work_too() -> None:
    log: list = []
    admission = Admission(max_pending_per_model=10)
    lane = FakeLane([[FakeDelivery(item(0), log)], [], [FakeDelivery(item(1), log)]])
    consumer, _, admitted = build(log, admission, lane)
    task = asyncio.ensure_future(consumer.run())
    for _ in range(100):
        if len(lane.fetches) >= 5:
            break
        await asyncio.sleep(0.001)
    consumer.stop()
    await asyncio.wait_for(task, 2.0)
    assert len(admitted) == 2 and len(lane.fetches) >= 5
    assert {timeout for _, timeout in lane.fetches} == {FETCH_WAIT_S}


async def test_work_for_another_config_is_naked_with_the_stream_delay_before_readiness() -> None:
    old, new = "0" * 64, "1" * 64
    log: list = []
    admission = Admission(10)
    consumer, _, admitted = build(log, admission, worker_hash=new)
    deliveries = [FakeDelivery(item(0, digest=new), log), FakeDelivery(item(1, digest=old), log),
                  FakeDelivery(item(2), log)]  # fmt: skip
    await consumer.accept(deliveries)
    assert ("nak", "r1.0", 5.0) in log and consumer.refused == 1
    assert [[w.item.work_item_id for w in works] for _, works in admitted] == [["r0.0", "r2.0"]]
    assert admission.total == 2  # the refused item's slot is free again
    log.clear()
    await consumer.accept([FakeDelivery(item(3, digest=old), log)])
    assert log == [("nak", "r3.0", 5.0)] and len(admitted) == 1  # nothing reaches readiness (no IPC)
