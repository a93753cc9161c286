"""The batch execution API: RunBatch in, per-item outcomes out, through a manager with real models."""

from __future__ import annotations

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
