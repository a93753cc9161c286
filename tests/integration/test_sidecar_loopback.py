"""The sidecar end to end in one process: LoopbackTransport + the real WorkerService over the baseline
models. Work items go to the lane subject, WorkResults come back on `_INBOX.test.>`."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from sie.catalog import parse_model_config
from sie.catalog.names import work_subject
from sie.settings import BatchingSettings, LaneSettings, SidecarSettings, StreamSettings
from sie.sidecar.sidecar import Sidecar, SidecarConfig
from sie.transport.base import Lane
from sie.transport.loopback import LoopbackTransport
from sie.wire import codes
from sie.wire.ipc_batch import RunBatchRequest
from sie.wire.queue import WorkItem, WorkResult
from sie.worker.manager import ModelManager
from sie.worker.runner import BatchRunner
from sie.worker.service import WorkerService
from support.polling import eventually

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SPLADE = "rasyosef/splade-tiny"
RAMPART = "nationaldesignstudio/rampart"
BROKEN = "acme/broken"
LANE = Lane("default", "default", "default")
POOL = LANE.pool
WAIT_S = 30.0


# --- helpers --------------------------------------------------------------------------------------


def work_item(index: int, model_id: str = MINILM, operation: str = "encode", **fields) -> WorkItem:
    base = dict(
        work_item_id=f"req-{index}.0", request_id=f"req-{index}", item_index=0, total_items=1,
        operation=operation, model_id=model_id, profile_id="default", pool_name=POOL, machine_profile="default",
        router_id="test", reply_subject=f"_INBOX.test.req-{index}", timestamp=time.time(),
    )  # fmt: skip
    base.update(fields)
    return WorkItem(**base)


async def publish(transport: LoopbackTransport, item: WorkItem) -> None:
    await transport.publish_work(work_subject(LANE.pool, LANE.machine_profile, LANE.bundle, item.model_id), item)


class Results:
    """Every WorkResult published under `_INBOX.test.>`; `wait(n)` returns once n have arrived."""

    def __init__(self) -> None:
        self.items: list[WorkResult] = []
        self.on_result = None

    async def handler(self, result: WorkResult) -> None:
        if self.on_result is not None:
            await self.on_result(result)
        self.items.append(result)

    async def wait(self, count: int, timeout_s: float = 60.0) -> list[WorkResult]:
        await eventually(lambda: len(self.items) >= count, timeout_s=timeout_s, what=f"{count} results")
        return self.items

    def by_request(self) -> dict[str, WorkResult]:
        return {result.request_id: result for result in self.items}


class CountingWorker:
    """The WorkerService, with its RunBatch calls recorded."""

    def __init__(self, service: WorkerService) -> None:
        self.service = service
        self.requests: list[RunBatchRequest] = []
        self.gate: asyncio.Event | None = None
        self.ready_gate: asyncio.Event | None = None

    async def ensure_model_ready(self, request):
        if self.ready_gate is not None:
            await self.ready_gate.wait()
        return await self.service.ensure_model_ready(request)

    async def run_batch(self, request: RunBatchRequest):
        self.requests.append(request)
        if self.gate is not None:
            await self.gate.wait()
        return await self.service.run_batch(request)

    def __getattr__(self, name: str):
        return getattr(self.service, name)


class RecordingTransport(LoopbackTransport):
    """A loopback whose deliveries record their in_progress calls and delivery counts."""

    def __init__(self, settings: StreamSettings) -> None:
        super().__init__(settings)
        self.progress: Counter[str] = Counter()
        self.deliveries: Counter[str] = Counter()

    async def consumer(self, lane: Lane):
        inner = await super().consumer(lane)
        return _RecordingConsumer(inner, self)


class _RecordingConsumer:
    def __init__(self, inner, transport: RecordingTransport) -> None:
        self._inner = inner
        self._transport = transport

    async def fetch(self, max_items: int, timeout_s: float):
        deliveries = await self._inner.fetch(max_items, timeout_s)
        for delivery in deliveries:
            self._transport.deliveries[delivery.item.work_item_id] += 1
        return [_Recorded(delivery, self._transport) for delivery in deliveries]


class _Recorded:
    """A delivery proxy counting in_progress calls."""

    def __init__(self, delivery, transport: RecordingTransport) -> None:
        self._delivery = delivery
        self._transport = transport
        self.item = delivery.item
        self.subject = delivery.subject
        self.num_delivered = delivery.num_delivered

    async def ack(self) -> None:
        await self._delivery.ack()

    async def nak(self, delay_s: float = 0.0) -> None:
        await self._delivery.nak(delay_s)

    async def in_progress(self) -> None:
        self._transport.progress[self.item.work_item_id] += 1
        await self._delivery.in_progress()


def sidecar_config(ack_wait_s: float = 30.0, load_hold_s: float = 20.0, **batching) -> SidecarConfig:
    return SidecarConfig(
        sidecar=SidecarSettings(load_hold_s=load_hold_s),
        batching=BatchingSettings(**batching),
        stream=StreamSettings(ack_wait_s=ack_wait_s, nak_delay_s=1.0),
        worker_id="worker-test",
    )


@pytest.fixture()
def catalog(baseline_catalog, tmp_path: Path):
    profile = {"adapter_path": "sie.adapters.dense:OnnxDenseAdapter", "max_batch_tokens": 1024}
    broken = parse_model_config(
        {"sie_id": BROKEN, "weights_path": str(tmp_path / "missing"), "profiles": {"default": profile}}
    )
    return baseline_catalog.with_models([broken])


@pytest.fixture()
def load_gate() -> threading.Event:
    """Open by default; a test clears it to hold a model load back while it watches the sidecar wait."""
    gate = threading.Event()
    gate.set()
    return gate


@pytest.fixture()
async def manager(catalog, load_model, model_loader, load_gate: threading.Event):
    def load(model, profile, model_id):
        load_gate.wait(timeout=60)  # runs in the manager's executor thread, never on the event loop
        if model_id == BROKEN:
            return model_loader.load(model, profile, model_id)
        return load_model(model_id)

    async with ModelManager(catalog, load) as manager:
        yield manager


@pytest.fixture()
def worker(manager) -> CountingWorker:
    return CountingWorker(
        WorkerService(manager, BatchRunner(manager), "worker-test", LaneSettings(), BatchingSettings())
    )


async def start(transport, worker, config: SidecarConfig | None = None) -> tuple[Results, Sidecar]:
    results = Results()
    await transport.subscribe_results("_INBOX.test.>", results.handler)
    return results, Sidecar(transport, worker, LANE, config or sidecar_config())


# --- the operations -------------------------------------------------------------------------------


async def test_encode_score_and_extract_through_the_sidecar(worker: CountingWorker) -> None:
    async with LoopbackTransport(StreamSettings()) as transport:
        results, sidecar = await start(transport, worker)
        async with sidecar:
            documents = [{"text": "dogs bark"}, {"text": "a cat is a small pet"}]
            sentence = {"text": "My name is John Smith and I live in Paris."}
            await publish(transport, work_item(0, item={"text": "Hello world"}))
            await publish(transport, work_item(1, SPLADE, "score", query_item={"text": "a cat"}, score_items=documents))
            await publish(transport, work_item(2, RAMPART, "extract", item=sentence))
            await results.wait(3)
        got = results.by_request()
        assert all(result.success for result in got.values()), [r.error for r in got.values()]
        dense = got["req-0"].result_msgpack.value["dense"]
        assert np.allclose(dense["values"][:2], [-0.034477, 0.031023], atol=1e-5)
        ranked = got["req-1"].result_msgpack.value
        assert [row["item_id"] for row in ranked] == ["item-1", "item-0"] and ranked[0]["rank"] == 0
        assert "entities" in got["req-2"].result_msgpack.value
        encode = got["req-0"]
        assert encode.worker_id == "worker-test" and encode.inference_ms > 0 and encode.queue_ms >= 0
        assert encode.tokenization_ms > 0 and encode.processing_ms > 0 and encode.units.input_tokens == 4
        # The sidecar's tokens were sent with the worker's tokenizer id, so the worker reused them.
        encode_batch = next(r for r in worker.requests if r.items[0].op == "encode")
        prepared = encode_batch.items[0].encode.prepared_tokens
        assert prepared is not None and [row.tolist() for row in prepared.input_ids] == [[101, 7592, 2088, 102]]
        assert prepared.tokenizer_id == worker.service.manager.get(MINILM).tokenizer.tokenizer_id
        assert await transport.pending(POOL) == 0


async def test_per_item_errors_do_not_fail_batch_mates(worker: CountingWorker) -> None:
    async with LoopbackTransport(StreamSettings()) as transport:
        results, sidecar = await start(transport, worker)
        async with sidecar:
            await publish(transport, work_item(0, item={"text": "fine"}))
            await publish(transport, work_item(1, item={"text": "bad"}, output_types=["nonsense"]))
            await publish(transport, work_item(2, operation="transcribe"))
            await results.wait(3)
        got = results.by_request()
        assert got["req-0"].success
        assert got["req-1"].error_code == codes.INVALID_INPUT and not got["req-1"].success
        assert got["req-2"].error_code == codes.INVALID_INPUT and "transcribe" in got["req-2"].error


# --- readiness ------------------------------------------------------------------------------------


async def test_a_cold_model_is_held_with_progress_acks_until_it_loads(worker: CountingWorker, load_gate) -> None:
    load_gate.clear()
    ack_wait = 0.5
    transport = RecordingTransport(StreamSettings(ack_wait_s=ack_wait))
    async with transport:
        results, sidecar = await start(transport, worker, sidecar_config(ack_wait_s=ack_wait))
        async with sidecar:
            await publish(transport, work_item(0, item={"text": "Hello world"}))
            # Held past several ack-waits: progress ACKs keep the single delivery alive.
            await eventually(lambda: transport.progress["req-0.0"] >= 3, timeout_s=WAIT_S)
            assert not results.items and transport.deliveries["req-0.0"] == 1
            load_gate.set()
            await results.wait(1)
        assert results.items[0].success and transport.deliveries["req-0.0"] == 1
        assert await transport.pending(POOL) == 0


async def test_work_waiting_outside_the_scheduler_is_kept_alive_with_progress_acks(worker: CountingWorker) -> None:
    # Stuck in readiness, on an EnsureModelReady the worker does not answer yet: only the lane-wide keepalive
    # progress-ACKs it there, so a short ack-wait redelivers nothing a live sidecar still holds (issue 13 §4).
    worker.ready_gate = asyncio.Event()
    ack_wait = 0.5
    transport = RecordingTransport(StreamSettings(ack_wait_s=ack_wait))
    async with transport:
        results, sidecar = await start(transport, worker, sidecar_config(ack_wait_s=ack_wait))
        async with sidecar:
            await publish(transport, work_item(0, item={"text": "Hello world"}))
            await eventually(lambda: transport.progress["req-0.0"] >= 3, timeout_s=WAIT_S)
            assert not results.items and transport.deliveries["req-0.0"] == 1
            worker.ready_gate.set()
            await results.wait(1)
        assert results.items[0].success and transport.deliveries["req-0.0"] == 1
        assert await transport.pending(POOL) == 0


async def test_a_load_held_too_long_answers_model_loading(worker: CountingWorker, load_gate) -> None:
    load_gate.clear()
    async with LoopbackTransport(StreamSettings()) as transport:
        results, sidecar = await start(transport, worker, sidecar_config(load_hold_s=0.2))
        async with sidecar:
            await publish(transport, work_item(0, item={"text": "Hello world"}))
            (result,) = await results.wait(1)
            load_gate.set()
        assert result.error_code == codes.MODEL_LOADING and result.retry_after_s == 5
        assert await transport.pending(POOL) == 0


async def test_a_load_outlasting_the_deadline_answers_model_loading_before_the_deadline(
    worker: CountingWorker, load_gate
) -> None:
    load_gate.clear()
    async with LoopbackTransport(StreamSettings()) as transport:
        results, sidecar = await start(transport, worker, sidecar_config(load_hold_s=300.0))
        async with sidecar:
            deadline = time.time() + 2.5
            await publish(transport, work_item(0, item={"text": "Hello world"}, deadline=deadline))
            (result,) = await results.wait(1)
            answered = time.time()
            load_gate.set()
        assert result.error_code == codes.MODEL_LOADING and result.retry_after_s == 5
        assert answered < deadline  # held (not the 300 s hold), then answered while the gateway still waits
        assert await transport.pending(POOL) == 0


async def test_a_model_that_fails_to_load_answers_model_load_failed(worker: CountingWorker) -> None:
    async with LoopbackTransport(StreamSettings()) as transport:
        results, sidecar = await start(transport, worker)
        async with sidecar:
            await publish(transport, work_item(0, BROKEN, item={"text": "x"}))
            await results.wait(1)
            await publish(transport, work_item(1, BROKEN, item={"text": "y"}))  # sticky: answered at once
            await results.wait(2)
        for result in results.items:
            assert result.error_code == codes.MODEL_LOAD_FAILED and not result.success
            assert BROKEN in result.error
            assert result.result_msgpack.value == {"error_class": "NOT_FOUND", "attempts": 1, "permanent": True}
        assert not worker.requests and await transport.pending(POOL) == 0


# --- settlement -----------------------------------------------------------------------------------


async def test_an_unsafe_reply_subject_is_ack_dropped(worker: CountingWorker) -> None:
    async with LoopbackTransport(StreamSettings()) as transport:
        results, sidecar = await start(transport, worker)
        stray: list[WorkResult] = []
        await transport.subscribe_results("sie.>", stray.append)
        async with sidecar:
            await publish(transport, work_item(0, item={"text": "x"}, reply_subject="sie.health.attack"))
            await eventually(_is_empty(transport), timeout_s=WAIT_S)
        assert not results.items and not stray and not worker.requests


# --- abandoned work (issue 13 §2) -----------------------------------------------------------------------


async def test_work_past_its_deadline_is_acked_away_without_running(worker: CountingWorker) -> None:
    async with LoopbackTransport(StreamSettings()) as transport:
        results, sidecar = await start(transport, worker)
        async with sidecar:
            await publish(transport, work_item(0, item={"text": "late"}, deadline=time.time() - 1.0))
            await publish(transport, work_item(1, item={"text": "in time"}, deadline=time.time() + 60.0))
            await results.wait(1)
            await eventually(_is_empty(transport), timeout_s=WAIT_S)
            assert sidecar.abandoned == {"expired": 1}
        assert [result.request_id for result in results.items] == ["req-1"]
        assert [item.work_item_id for request in worker.requests for item in request.items] == ["req-1.0"]


async def test_a_cancelled_request_held_for_a_model_load_is_dropped_not_computed(
    worker: CountingWorker, load_gate
) -> None:
    load_gate.clear()
    async with LoopbackTransport(StreamSettings()) as transport:
        results, sidecar = await start(transport, worker, sidecar_config(load_hold_s=30.0))
        async with sidecar:
            await publish(transport, work_item(0, item={"text": "abandoned"}))
            await publish(transport, work_item(1, item={"text": "wanted"}))
            await eventually(lambda: sidecar.pending == 2, timeout_s=WAIT_S)  # both held for the load
            await transport.publish("work_cancel.test.req-0", {"router_id": "test", "request_id": "req-0"})
            await eventually(lambda: sidecar.abandoned == {"cancelled": 1}, timeout_s=WAIT_S)
            load_gate.set()
            await results.wait(1)
            await eventually(_is_empty(transport), timeout_s=WAIT_S)
        assert [result.request_id for result in results.items] == ["req-1"]
        assert [item.work_item_id for request in worker.requests for item in request.items] == ["req-1.0"]


def _is_empty(transport: LoopbackTransport):
    async def check() -> bool:
        return await transport.pending(POOL) == 0

    return check


async def test_results_are_published_before_the_ack(worker: CountingWorker) -> None:
    async with LoopbackTransport(StreamSettings()) as transport:
        results, sidecar = await start(transport, worker)
        seen_pending: list[int] = []

        async def record(result: WorkResult) -> None:
            seen_pending.append(await transport.pending(POOL))

        results.on_result = record
        async with sidecar:
            await publish(transport, work_item(0, item={"text": "Hello world"}))
            await results.wait(1)
            await eventually(_is_empty(transport), timeout_s=WAIT_S)
        assert seen_pending == [1]  # still unacked while its reply was being delivered


async def test_concurrent_single_items_are_answered_once_and_batched(worker: CountingWorker) -> None:
    async with LoopbackTransport(StreamSettings()) as transport:
        results, sidecar = await start(transport, worker)
        async with sidecar:
            texts = [f"sentence number {i} about {'cats' if i % 2 else 'the weather today'}" for i in range(100)]
            await asyncio.gather(*(publish(transport, work_item(i, item={"text": t})) for i, t in enumerate(texts)))
            await results.wait(100)
            await eventually(_is_empty(transport), timeout_s=WAIT_S)
        counts = Counter(result.request_id for result in results.items)
        assert len(counts) == 100 and set(counts.values()) == {1}
        assert all(result.success for result in results.items)
        assert 1 <= len(worker.requests) < 100
        assert sum(len(request.items) for request in worker.requests) == 100


async def test_drain_finishes_in_flight_work_and_stops_fetching(worker: CountingWorker) -> None:
    async with LoopbackTransport(StreamSettings()) as transport:
        results, sidecar = await start(transport, worker)
        async with sidecar:
            await publish(transport, work_item(0, item={"text": "warm up"}))
            await results.wait(1)
            worker.gate = asyncio.Event()
            for index in range(1, 6):
                await publish(transport, work_item(index, item={"text": f"item {index}"}))
            await eventually(lambda: len(worker.requests) >= 2, timeout_s=WAIT_S)  # a batch is in flight on the worker
            drained = asyncio.ensure_future(sidecar.drain(deadline_s=30.0))
            await eventually(lambda: not sidecar.fetching, timeout_s=WAIT_S)
            worker.gate.set()
            assert await drained is True
            await publish(transport, work_item(99, item={"text": "after drain"}))
            assert await transport.pending(POOL) == 1  # nobody fetches it
        got = results.by_request()
        assert all(f"req-{i}" in got and got[f"req-{i}"].success for i in range(6)) and "req-99" not in got
