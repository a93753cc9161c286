"""The sidecar's hash gate: deliveries for another bundle_config_hash are refused (the consumer NAKs them,
test_sidecar_consumer.py); equal or empty hashes proceed; the worker's hash comes from Ping, refreshed on
disagreement at most once per interval; only verified items echo the executed hash."""

from __future__ import annotations

from sie.sidecar.hashgate import WorkerHash, split_by_hash
from sie.sidecar.results import BatchTimings, outcome_result
from sie.sidecar.work import Work
from sie.wire.ipc_batch import DISPOSITION_PUBLISH_AND_ACK, DISPOSITION_PUBLISH_ERROR_AND_ACK, ItemOutcome
from sie.wire.ipc_control import PingRequest, PingResponse
from sie.wire.queue import WorkItem

OLD, NEW = "0" * 64, "1" * 64


class FakeDelivery:
    def __init__(self, item: WorkItem) -> None:
        self.item = item
        self.subject = "sie.work.default.default.default.m"


def work(index: int, digest: str | None) -> Work:
    item = WorkItem(
        work_item_id=f"r{index}.0", request_id=f"r{index}", item_index=0, total_items=1, operation="encode",
        model_id="m", profile_id="default", pool_name="default", machine_profile="default", router_id="gw",
        reply_subject=f"_INBOX.gw.r{index}", timestamp=0.0, bundle_config_hash=digest,
    )  # fmt: skip
    return Work(FakeDelivery(item), 0.0)


class PingWorker:
    def __init__(self, digest: str, fail: bool = False) -> None:
        self.digest = digest
        self.fail = fail
        self.pings = 0

    async def ping(self, request: PingRequest) -> PingResponse:
        self.pings += 1
        if self.fail:
            raise ConnectionError("worker gone")
        return PingResponse(timestamp_ms=request.timestamp_ms, worker_id="w", bundle_config_hash=self.digest)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ids(works: list[Work]) -> list[str]:
    return [w.item.work_item_id for w in works]


def test_split_refuses_only_a_different_nonempty_hash() -> None:
    works = [work(0, NEW), work(1, OLD), work(2, None), work(3, "")]
    proceed, refuse = split_by_hash(works, NEW)
    assert (ids(proceed), ids(refuse)) == (["r0.0", "r2.0", "r3.0"], ["r1.0"])
    assert [w.verified_hash for w in proceed] == [NEW, None, None]


def test_an_unknown_or_empty_worker_hash_lets_everything_through() -> None:
    for current in (None, ""):
        proceed, refuse = split_by_hash([work(0, NEW)], current)
        assert ids(proceed) == ["r0.0"] and not refuse and proceed[0].verified_hash is None


async def test_disagreement_refreshes_once_per_interval() -> None:
    worker, clock = PingWorker(OLD), Clock()
    gate = WorkerHash(worker, refresh_interval_s=1.0, clock=clock)
    assert ids((await gate.split([work(0, OLD)]))[0]) == ["r0.0"] and worker.pings == 1
    await gate.split([work(1, OLD)])
    assert worker.pings == 1  # the cached hash agrees: no Ping
    worker.digest = NEW  # the worker applied a config; the first NEW item is judged after one Ping
    clock.now += 2.0
    proceed, refuse = await gate.split([work(2, NEW), work(3, OLD)])
    assert (ids(proceed), ids(refuse), worker.pings) == (["r2.0"], ["r3.0"], 2)
    await gate.split([work(4, OLD)])
    assert worker.pings == 2  # rate-limited


async def test_a_failed_ping_keeps_the_old_hash() -> None:
    worker, clock = PingWorker(OLD), Clock()
    gate = WorkerHash(worker, clock=clock)
    await gate.refresh()
    worker.fail = True
    clock.now += 5.0
    await gate.refresh()
    assert gate.current == OLD


def test_only_successful_verified_results_echo_the_executed_hash() -> None:
    timings = BatchTimings(queue_start=0.0, processing_ms=1.0)
    item = work(0, NEW).item
    ok = ItemOutcome(work_item_id="r0.0", request_id="r0", item_index=0, disposition=DISPOSITION_PUBLISH_AND_ACK,
                     result_msgpack=b"\x80")  # fmt: skip
    failed = ItemOutcome(work_item_id="r0.0", request_id="r0", item_index=0,
                         disposition=DISPOSITION_PUBLISH_ERROR_AND_ACK, error="boom")  # fmt: skip
    assert outcome_result(item, ok, timings, "w", 0.0, NEW).executed_bundle_config_hash == NEW
    assert outcome_result(item, ok, timings, "w", 0.0).executed_bundle_config_hash is None
    assert outcome_result(item, failed, timings, "w", 0.0, NEW).executed_bundle_config_hash is None
