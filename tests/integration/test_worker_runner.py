"""The batch execution API: RunBatch in, per-item outcomes out, through a manager with real models."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import attrs
import numpy as np
import pytest

from sie.wire import codes
from sie.wire.ipc_batch import (
    DISPOSITION_NAK_RETRY,
    DISPOSITION_PUBLISH_AND_ACK,
    DISPOSITION_PUBLISH_ERROR_AND_ACK,
    EncodeBatchItem,
    RunBatchItem,
    RunBatchRequest,
    ScoreBatchItem,
)
from sie.worker.manager import ModelManager
from sie.worker.run_memory import PROCESS_HEAP
from sie.worker.runner import BatchRunner, to_batch_outcome

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def encode(index: int, text: str, **fields) -> RunBatchItem:
    body = EncodeBatchItem(
        work_item_id=f"r.{index}", request_id="r", item_index=index, total_items=3, timestamp=0.0,
        item={"text": text}, **fields,
    )  # fmt: skip
    return RunBatchItem(op="encode", work_item_id=body.work_item_id, request_id="r", item_index=index, encode=body)


def request(items, model_id=MINILM) -> RunBatchRequest:
    return RunBatchRequest(model_id=model_id, batch_id=1, lora_key="", total_cost=10, items=items)


@pytest.fixture()
async def runner(baseline_catalog, load_model):
    async with ModelManager(baseline_catalog, lambda model, profile, model_id: load_model(model_id)) as manager:
        await manager.wait_ready(MINILM)
        yield BatchRunner(manager)


async def test_encode_batch_outcomes(runner: BatchRunner) -> None:
    batch = request([encode(0, "Hello world"), encode(1, "x", output_types=["sparse"]), encode(2, "Bye")])
    executed = await runner.execute(batch)
    assert executed.results.items[0].result["dense"]["dims"] == 384
    assert executed.results.inference_ms > 0
    outcome = to_batch_outcome(batch, executed)
    first, second, third = outcome.outcomes
    assert first.disposition == DISPOSITION_PUBLISH_AND_ACK and first.work_item_id == "r.0"
    decoded = first.result_msgpack.value
    assert decoded is executed.results.items[0].result  # the adapter's own object: nothing was packed
    assert np.allclose(decoded["dense"]["values"][:2], [-0.034477, 0.031023], atol=1e-5)
    assert first.units.input_tokens == 4 and first.inference_ms > 0
    assert second.disposition == DISPOSITION_PUBLISH_ERROR_AND_ACK and second.error_code == codes.INVALID_INPUT
    assert third.disposition == DISPOSITION_PUBLISH_AND_ACK


async def test_model_not_loaded_naks_every_item(runner: BatchRunner) -> None:
    batch = request([encode(0, "a")], model_id="rasyosef/splade-tiny")
    outcome = to_batch_outcome(batch, await runner.execute(batch))
    assert outcome.outcomes[0].disposition == DISPOSITION_NAK_RETRY and outcome.outcomes[0].nak_delay_ms > 0


async def test_mixed_operations_are_refused(runner: BatchRunner) -> None:
    score = ScoreBatchItem(
        work_item_id="s.0", request_id="s", item_index=0, total_items=1, timestamp=0.0,
        query_item={"text": "q"}, score_items=[{"text": "d"}],
    )  # fmt: skip
    batch = request([encode(0, "a"), RunBatchItem(op="score", score=score)])
    outcome = to_batch_outcome(batch, await runner.execute(batch))
    assert {o.error for o in outcome.outcomes} == {"run_batch_mixed_op"}
    assert {o.error_code for o in outcome.outcomes} == {"inference_error"}


async def test_unknown_operation(runner: BatchRunner) -> None:
    batch = request([RunBatchItem(op="generate")])
    outcome = to_batch_outcome(batch, await runner.execute(batch))
    assert outcome.outcomes[0].error == "run_batch_unknown_op"


class TightMemory:
    """The real adapter, failing as onnxruntime does when a batch needs more memory than there is."""

    def __init__(self, adapter, max_items: int) -> None:
        self.adapter = adapter
        self.max_items = max_items
        self.calls: list[int] = []

    def encode(self, items):
        self.calls.append(len(items))
        if len(items) > self.max_items:
            raise RuntimeError(
                "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running Gemm node. "
                "Name:'mlm.logits' Status Message: Failed to allocate memory for requested buffer of size 1048576"
            )
        return self.adapter.encode(items)


async def test_a_batch_that_cannot_allocate_runs_in_halves_and_every_item_succeeds(
    baseline_catalog, load_model
) -> None:
    tight: list[TightMemory] = []

    def load(model, profile, model_id):
        loaded = load_model(model_id)
        tight.append(TightMemory(loaded.adapter, max_items=2))
        return attrs.evolve(loaded, adapter=tight[-1])

    async with ModelManager(baseline_catalog, load) as manager:
        await manager.wait_ready(MINILM)
        batch = request([encode(index, f"text {index}") for index in range(5)])
        executed = await BatchRunner(manager).execute(batch)
    assert [item.ok for item in executed.results.items] == [True] * 5
    assert tight[0].calls == [5, 2, 3, 1, 2]  # 5 fails; halves 2 and 3; 3 fails; halves 1 and 2
    alone = load_model(MINILM).adapter.encode([encode(4, "text 4").encode]).items[0].result["dense"]["values"]
    assert np.allclose(executed.results.items[4].result["dense"]["values"], alone, atol=1e-5)


async def test_an_item_that_cannot_allocate_alone_is_resource_exhausted_without_runtime_internals(
    baseline_catalog, load_model
) -> None:
    def load(model, profile, model_id):
        loaded = load_model(model_id)
        return attrs.evolve(loaded, adapter=TightMemory(loaded.adapter, max_items=0))

    async with ModelManager(baseline_catalog, load) as manager:
        await manager.wait_ready(MINILM)
        batch = request([encode(0, "a"), encode(1, "b")])
        outcome = to_batch_outcome(batch, await BatchRunner(manager).execute(batch))
    for item in outcome.outcomes:
        assert item.disposition == DISPOSITION_PUBLISH_ERROR_AND_ACK
        assert item.error_code == codes.RESOURCE_EXHAUSTED and item.retry_after_s == 5
        assert "ONNXRuntime" not in item.error and "Gemm" not in item.error and "out of memory" in item.error


async def test_the_heap_a_large_batch_freed_goes_back_once_the_runner_is_idle_not_between_batches(
    baseline_catalog, load_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """32 texts of 128+ tokens are over the trim threshold: while batches keep coming (gaps shorter than the idle
    delay) nothing is trimmed; a quiet spell trims once, on the runner's executor."""
    released: list[str] = []
    release = PROCESS_HEAP.release

    def recorded() -> None:
        released.append(threading.current_thread().name)
        release()

    monkeypatch.setattr(PROCESS_HEAP, "release", recorded)
    heap = PROCESS_HEAP
    heap.pending = False
    executor = ThreadPoolExecutor(1, thread_name_prefix="runs")
    long_text = " ".join(["river"] * 130)
    large = request([encode(index, long_text) for index in range(32)])
    try:
        async with ModelManager(baseline_catalog, lambda model, profile, model_id: load_model(model_id)) as manager:
            await manager.wait_ready(MINILM)
            runner = BatchRunner(manager, executor, idle_trim_delay_s=0.3)
            for _ in range(3):
                executed = await runner.execute(large)
                assert all(item.ok for item in executed.results.items)
                assert heap.pending and released == []
                await asyncio.sleep(0.05)
            small = await runner.execute(request([encode(0, "short")]))
            assert small.results.items[0].ok and released == []  # a small batch after a large one: still pending
            for _ in range(40):
                if released:
                    break
                await asyncio.sleep(0.05)
            assert released == ["runs_0"] and not heap.pending
            await runner.execute(request([encode(0, "short")]))
            await asyncio.sleep(0.5)
            assert released == ["runs_0"]  # nothing new was freed by a small batch: no second trim
    finally:
        executor.shutdown()
