"""Dispatch: one RunBatch per formed batch; per-item outcomes become WorkResults, published with one
flush per batch before the ACKs; nak_retry items and failed IPC calls are NAKed."""

from __future__ import annotations

import asyncio
import time

import attrs
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sie.sidecar.admission import Admission
from sie.sidecar.dispatcher import BatchDispatcher
from sie.sidecar.prep import encode_item
from sie.sidecar.scheduler import Batch
from sie.sidecar.settlement import Settler
from sie.sidecar.work import BatchLimits, ReadyModel, Work
from sie.telemetry.tracing import Tracing
from sie.wire import codes
from sie.wire.ipc_batch import BatchOutcome, ItemOutcome, RunBatchRequest
from sie.wire.ipc_control import ModelDescriptor
from sie.wire.queue import UnitCounts, WorkItem, WorkResult
from support.sidecar_fakes import RecordingDelivery as FakeDelivery


class FakeBus:
    def __init__(self, log: list) -> None:
        self._log = log
        self.results: dict[str, WorkResult] = {}

    async def publish_result(self, subject: str, result: WorkResult) -> None:
        self.results[result.work_item_id] = result
        self._log.append(("publish", result.work_item_id))

    async def flush(self) -> None:
        self._log.append(("flush",))


def outcome(work_item_id: str, disposition: str = "publish_and_ack", **fields) -> ItemOutcome:
    return ItemOutcome(work_item_id=work_item_id, request_id=work_item_id.split(".")[0], item_index=0,
                       disposition=disposition, **fields)  # fmt: skip


class FakeWorker:
    def __init__(self, answer) -> None:
        self.answer = answer
        self.requests: list[RunBatchRequest] = []

    async def run_batch(self, request: RunBatchRequest) -> BatchOutcome:
        self.requests.append(request)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer(request)


def batch(log: list, count: int = 3, lora: str = "") -> Batch:
    works = []
    for index in range(count):
        item = WorkItem(
            work_item_id=f"r{index}.0", request_id=f"r{index}", item_index=0, total_items=1, operation="encode",
            model_id="m", profile_id="default", pool_name="default", machine_profile="default", router_id="gw",
            reply_subject=f"_INBOX.gw.r{index}", timestamp=time.time() - 0.5, item={"text": "x"},
        )  # fmt: skip
        work = Work(FakeDelivery(item, log), 0.0)
        work.run_item, work.prep_ms, work.cost = encode_item(item, None), 0.25, 4
        works.append(work)
    model = ReadyModel("m", ModelDescriptor(), BatchLimits(100, 8))
    return Batch(model, "encode", lora, works, cost=4 * count)


async def run(
    worker: FakeWorker, the_batch: Batch, log: list, tracing: Tracing | None = None
) -> tuple[FakeBus, list[str]]:
    bus, forgotten = FakeBus(log), []
    admission = Admission(100)
    admission.admit("m", the_batch.works)
    dispatcher = BatchDispatcher(worker, Settler(bus, admission), forgotten.append, "w1", nak_delay_s=5.0,
                                 tracing=tracing)  # fmt: skip
    dispatcher.start()
    try:
        await dispatcher.dispatch(the_batch)
    finally:
        await dispatcher.close()
    assert admission.total == 0  # every item settled one way or another
    return bus, forgotten


async def test_outcomes_become_results_published_before_acks() -> None:
    log: list = []

    def answer(request: RunBatchRequest) -> BatchOutcome:
        return BatchOutcome(outcomes=[
            outcome(item.work_item_id, result_msgpack=b"\x81\xa1a\x01", inference_ms=3.0, tokenization_ms=0.5,
                    postprocessing_ms=0.1, units=UnitCounts(input_tokens=4))
            for item in request.items
        ])  # fmt: skip

    worker = FakeWorker(answer)
    bus, _ = await run(worker, batch(log, lora="a"), log)
    request = worker.requests[0]
    assert (request.model_id, request.lora_key, request.total_cost, len(request.items)) == ("m", "a", 12, 3)
    assert [entry[0] for entry in log] == ["publish"] * 3 + ["flush"] + ["ack"] * 3  # one flush per batch
    result = bus.results["r0.0"]
    assert result.success and result.result_msgpack.packed() == b"\x81\xa1a\x01" and result.worker_id == "w1"
    assert result.tokenization_ms == pytest.approx(0.75) and result.inference_ms == 3.0
    assert result.postprocessing_ms == 0.1 and result.units.input_tokens == 4
    assert 400.0 < result.queue_ms < 5000.0 and result.processing_ms >= 0.0


async def test_item_errors_are_published_and_nak_retry_items_are_naked() -> None:
    log: list = []

    def answer(request: RunBatchRequest) -> BatchOutcome:
        return BatchOutcome(outcomes=[
            outcome("r0.0", result_msgpack=b"\x80"),
            outcome("r1.0", "publish_error_and_ack", error="too long", error_code=codes.INPUT_TOO_LONG),
            outcome("r2.0", "nak_retry", nak_delay_ms=1000, error="not loaded"),
        ])  # fmt: skip

    bus, forgotten = await run(FakeWorker(answer), batch(log), log)
    assert bus.results["r0.0"].success
    assert not bus.results["r1.0"].success and bus.results["r1.0"].error_code == codes.INPUT_TOO_LONG
    assert "r2.0" not in bus.results and ("nak", "r2.0", 1.0) in log
    assert ("ack", "r1.0") in log and forgotten == ["m"]


async def test_a_failed_ipc_call_naks_the_whole_batch() -> None:
    log: list = []
    bus, forgotten = await run(FakeWorker(ConnectionError("worker gone")), batch(log), log)
    assert not bus.results and log == [("nak", f"r{i}.0", 5.0) for i in range(3)] and forgotten == ["m"]


async def test_outcomes_are_matched_by_id_and_missing_ones_naked() -> None:
    log: list = []

    def answer(request: RunBatchRequest) -> BatchOutcome:
        return BatchOutcome(outcomes=[outcome("r2.0", result_msgpack=b"\x80"), outcome("r0.0", result_msgpack=b"\x80")])

    bus, _ = await run(FakeWorker(answer), batch(log), log)
    assert set(bus.results) == {"r0.0", "r2.0"} and ("nak", "r1.0", 5.0) in log


async def test_a_success_without_bytes_becomes_an_error() -> None:
    log: list = []
    bus, _ = await run(FakeWorker(lambda request: BatchOutcome(outcomes=[outcome("r0.0")])), batch(log, 1), log)
    assert not bus.results["r0.0"].success and bus.results["r0.0"].error_code == codes.QUEUE_INFERENCE_ERROR


async def test_finishing_overlaps_the_next_batch() -> None:
    """dispatch returns once the worker answered; publication happens in the finishing task."""
    log: list = []
    gate = asyncio.Event()

    class SlowBus(FakeBus):
        async def flush(self) -> None:
            await gate.wait()
            await super().flush()

    admission = Admission(100)
    the_batch = batch(log, 1)
    admission.admit("m", the_batch.works)
    dispatcher = BatchDispatcher(FakeWorker(lambda r: BatchOutcome(outcomes=[outcome("r0.0", result_msgpack=b"\x80")])),
                                 Settler(SlowBus(log), admission), lambda model_id: None, "w1", 5.0)  # fmt: skip
    dispatcher.start()
    await asyncio.wait_for(dispatcher.dispatch(the_batch), 1.0)
    assert ("ack", "r0.0") not in log
    gate.set()
    await dispatcher.close()
    assert ("ack", "r0.0") in log


async def test_traced_a_batch_records_its_wait_and_dispatch_and_the_worker_continues_the_dispatch_span() -> None:
    log: list = []
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider)
    the_batch = batch(log, count=2)
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    for work in the_batch.works:
        work.item = attrs.evolve(work.item, traceparent=caller)
    worker = FakeWorker(lambda request: BatchOutcome(outcomes=[outcome(i.work_item_id) for i in request.items]))
    await run(worker, the_batch, log, tracing)
    spans = {span.name: span for span in exporter.get_finished_spans()}
    wait, dispatch = spans["sidecar.batch_wait"], spans["sidecar.dispatch"]
    assert wait.parent.span_id == dispatch.parent.span_id == int("b7ad6b7169203331", 16)
    assert dispatch.attributes["sie.batch_size"] == 2 and wait.attributes["sie.batch_cost"] == 8
    carried = {item.traceparent for item in worker.requests[0].items}
    assert carried == {f"00-0af7651916cd43dd8448eb211c80319c-{dispatch.context.span_id:016x}-01"}
    tracing.close()
