"""The worker's hash gate (contracts Part A §2.1) and execution barrier: a batch with any non-empty hash
other than the worker's pool-scoped one comes back whole as nak_retry after 5 s with no error code; empty
hashes are legacy and run; config apply waits for running batches and batches queued behind it run on the
new config."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sie.catalog import Catalog, dump_yaml, load_catalog, load_yaml
from sie.settings import BatchingSettings, LaneSettings
from sie.wire.ipc_batch import (
    DISPOSITION_NAK_RETRY,
    DISPOSITION_PUBLISH_ERROR_AND_ACK,
    EncodeBatchItem,
    RunBatchItem,
    RunBatchRequest,
)
from sie.wire.ipc_control import ApplyModelConfigRequest
from sie.worker.manager import ModelManager
from sie.worker.runner import HASH_GATE_NAK_DELAY_MS, ExecutedBatch
from sie.worker.service import ExecutionBarrier, WorkerService

REPO = Path(__file__).resolve().parents[2]
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


class FakeRunner:
    """Records which batches executed; optionally blocks until `release` is set."""

    def __init__(self) -> None:
        self.executed: list[int] = []
        self.started = asyncio.Event()
        self.release: asyncio.Event | None = None

    async def execute(self, request: RunBatchRequest) -> ExecutedBatch:
        self.started.set()
        if self.release is not None:
            await self.release.wait()
        self.executed.append(request.batch_id)
        return ExecutedBatch(error="not a real model", error_code="INFERENCE_ERROR")


def batch(batch_id: int, *hashes: str | None) -> RunBatchRequest:
    items = [
        RunBatchItem(op="encode", work_item_id=f"r.{i}", item_index=i, encode=EncodeBatchItem(
            work_item_id=f"r.{i}", request_id="r", item_index=i, total_items=len(hashes), timestamp=0.0,
            item={"text": "x"}, bundle_config_hash=digest))
        for i, digest in enumerate(hashes)
    ]  # fmt: skip
    return RunBatchRequest(model_id=MINILM, batch_id=batch_id, lora_key="", total_cost=1, items=items)


def new_model_yaml() -> str:
    data = load_yaml((REPO / "config" / "models" / "sentence-transformers__all-MiniLM-L6-v2.yaml").read_text())
    data["sie_id"] = "acme/minilm-copy"
    return dump_yaml(data)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")


async def test_a_foreign_hash_naks_the_whole_batch(catalog: Catalog) -> None:
    runner = FakeRunner()
    async with ModelManager(catalog, lambda *args: None) as manager:
        worker = WorkerService(manager, runner, "w", LaneSettings(), BatchingSettings())  # type: ignore[arg-type]
        current = worker.bundle_config_hash()
        outcome = await worker.run_batch(batch(1, current, "0" * 64, None))
        assert {o.disposition for o in outcome.outcomes} == {DISPOSITION_NAK_RETRY}
        assert {o.nak_delay_ms for o in outcome.outcomes} == {HASH_GATE_NAK_DELAY_MS}
        assert {o.error_code for o in outcome.outcomes} == {None}
        assert runner.executed == []
        for request in (batch(2, current, current), batch(3, None, ""), batch(4)):
            outcome = await worker.run_batch(request)
            assert {o.disposition for o in outcome.outcomes} <= {DISPOSITION_PUBLISH_ERROR_AND_ACK}
        assert runner.executed == [2, 3, 4]


async def test_the_worker_hash_is_pool_scoped_and_cached_per_snapshot(catalog: Catalog) -> None:
    async with ModelManager(catalog, lambda *args: None) as manager:
        worker = WorkerService(manager, FakeRunner(), "w", LaneSettings(pool="gpu-x"), BatchingSettings())  # type: ignore[arg-type]
        assert worker.bundle_config_hash() == catalog.bundle_config_hash("default", "gpu-x") == ""
        default = WorkerService(manager, FakeRunner(), "w", LaneSettings(), BatchingSettings())  # type: ignore[arg-type]
        assert default.bundle_config_hash() is default.bundle_config_hash()


async def test_apply_waits_for_running_batches_and_later_batches_see_the_new_config(catalog: Catalog) -> None:
    runner = FakeRunner()
    runner.release = asyncio.Event()
    async with ModelManager(catalog, lambda *args: None) as manager:
        worker = WorkerService(manager, runner, "w", LaneSettings(), BatchingSettings())  # type: ignore[arg-type]
        old = worker.bundle_config_hash()
        running = asyncio.ensure_future(worker.run_batch(batch(1, old)))
        await runner.started.wait()
        apply = asyncio.ensure_future(worker.apply_model_config(ApplyModelConfigRequest(
            bundle_id="default", model_id="acme/minilm-copy", epoch=1, bundle_config_hash="",
            model_config=new_model_yaml())))  # fmt: skip
        queued = asyncio.ensure_future(worker.run_batch(batch(2, old)))
        await asyncio.sleep(0.01)
        assert not apply.done() and not queued.done()
        assert worker.bundle_config_hash() == old  # the config does not change under a running batch
        runner.release.set()
        await running
        new = (await apply).bundle_config_hash
        assert new != old
        gated = await queued  # queued behind the apply: it ran against the new hash and was refused
        assert {o.disposition for o in gated.outcomes} == {DISPOSITION_NAK_RETRY}
        assert runner.executed == [1]


async def test_barrier_is_shared_for_readers_and_fifo_for_a_writer() -> None:
    barrier, order = ExecutionBarrier(), []

    async def reader(name: str, hold: asyncio.Event) -> None:
        async with barrier.shared():
            order.append(f"{name}+")
            await hold.wait()
            order.append(f"{name}-")

    async def writer() -> None:
        async with barrier.exclusive():
            order.append("w")

    first, second = asyncio.Event(), asyncio.Event()
    tasks = [asyncio.ensure_future(reader("a", first)), asyncio.ensure_future(reader("b", first))]
    await asyncio.sleep(0)
    tasks.append(asyncio.ensure_future(writer()))
    tasks.append(asyncio.ensure_future(reader("c", second)))
    await asyncio.sleep(0.01)
    assert order == ["a+", "b+"] and barrier.readers == 2  # the writer waits; c waits behind the writer
    first.set()
    second.set()
    await asyncio.gather(*tasks)
    assert order[2:] == ["a-", "b-", "w", "c+", "c-"]
    assert (barrier.readers, barrier.writer) == (0, False)


async def test_a_cancelled_waiter_does_not_block_the_barrier() -> None:
    barrier = ExecutionBarrier()
    async with barrier.shared():
        waiting = asyncio.ensure_future(barrier._acquire(exclusive=True))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
    async with barrier.exclusive():
        assert barrier.writer
    assert (barrier.readers, barrier.writer) == (0, False)
