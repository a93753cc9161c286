"""The batch runner: what it measures per model (counts, device-seconds, an average cost per item), and how
it isolates an item whose adapter call raises (issue 14 §1). The adapter is the seam here: a tiny in-process
one whose failure depends on the item, so the runner's bisection is what is under test.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import pytest

from sie.catalog import Catalog, parse_bundle, parse_model_config
from sie.wire import codes
from sie.wire.ipc_batch import (
    DISPOSITION_PUBLISH_AND_ACK,
    DISPOSITION_PUBLISH_ERROR_AND_ACK,
    EncodeBatchItem,
    RunBatchItem,
    RunBatchRequest,
)
from sie.worker.adapters import BatchResult, ItemResult
from sie.worker.loading import LoadedModel
from sie.worker.manager import ModelManager
from sie.worker.runner import (
    COST_EMA_WEIGHT,
    RESOURCE_EXHAUSTED_RETRY_AFTER_S,
    BatchRunner,
    ModelUsage,
    to_batch_outcome,
)


def test_the_first_batch_sets_the_cost_and_later_ones_move_it_by_the_ema_weight() -> None:
    usage = ModelUsage()
    assert usage.cost_per_item_s is None
    usage.record(items=4, seconds=0.4)
    assert usage.cost_per_item_s == pytest.approx(0.1)
    usage.record(items=2, seconds=0.6)
    assert usage.cost_per_item_s == pytest.approx(0.1 + COST_EMA_WEIGHT * (0.3 - 0.1))
    assert (usage.batches, usage.items) == (2, 6)
    assert usage.compute_seconds == pytest.approx(1.0)


def test_an_empty_batch_counts_as_one_item() -> None:
    usage = ModelUsage()
    usage.record(items=0, seconds=0.2)
    assert usage.cost_per_item_s == pytest.approx(0.2)


BUNDLE = parse_bundle({"name": "default", "priority": 10, "adapters": ["sie.adapters.dense"]})
MODEL = "org/picky"
PROFILE = {"adapter_path": "sie.adapters.dense:DenseAdapter", "max_batch_tokens": 1024}
# The text of an adapter exception may hold runtime internals; a caller must never see it.
INTERNALS = "unhashable type: 'list' (/opt/onnxruntime/core/session.cc:42)"


class Picky:
    """A tiny adapter whose failure depends on the item: any call holding a text in `bad` raises, as a real
    adapter does on a poison item; every call's size is recorded."""

    def __init__(self, bad: set[str], error: type[Exception] = TypeError, message: str = INTERNALS) -> None:
        self.bad = bad
        self.error = error
        self.message = message
        self.calls: list[int] = []

    def encode(self, items: list[EncodeBatchItem]) -> BatchResult:
        self.calls.append(len(items))
        texts = [item.item["text"] for item in items]
        if self.bad.intersection(texts):
            raise self.error(self.message)
        return BatchResult([ItemResult(result={"echo": text}, input_tokens=1) for text in texts], inference_ms=1.0)


def _batch(texts: list[str]) -> RunBatchRequest:
    items = []
    for index, text in enumerate(texts):
        body = EncodeBatchItem(
            work_item_id=f"r.{index}", request_id="r", item_index=index, total_items=len(texts), timestamp=0.0,
            item={"text": text},
        )  # fmt: skip
        items.append(RunBatchItem(op="encode", work_item_id=body.work_item_id, request_id="r", item_index=index,
                                  encode=body))  # fmt: skip
    return RunBatchRequest(model_id=MODEL, batch_id=7, lora_key="", total_cost=len(texts), items=items)


@contextlib.asynccontextmanager
async def _runner(adapter: Picky) -> AsyncIterator[BatchRunner]:
    model = parse_model_config({"sie_id": MODEL, "hf_id": MODEL, "profiles": {"default": PROFILE}})

    def load(model, profile, model_id) -> LoadedModel:
        return LoadedModel(model_id, profile, adapter=adapter, tokenizer=None, memory_bytes=1)

    async with ModelManager(Catalog([BUNDLE], [model]), load) as manager:
        await manager.wait_ready(MODEL)
        yield BatchRunner(manager)


@pytest.mark.parametrize(
    ("size", "bad"),
    [(1, set()), (1, {0}), (2, {1}), (5, {2}), (8, {0}), (8, {7}), (8, {1, 6}), (13, {3, 4, 5}), (16, {0, 5, 10, 15})]
    + [(size, set(range(size))) for size in (2, 3, 8, 13)],
)
async def test_only_the_failing_items_fail_within_2n_minus_1_adapter_calls(
    size: int, bad: set[int], caplog: pytest.LogCaptureFixture
) -> None:
    texts = [f"text {index}" for index in range(size)]
    adapter = Picky({texts[index] for index in bad})
    batch = _batch(texts)
    with caplog.at_level(logging.WARNING, logger="sie.worker.runner"):
        async with _runner(adapter) as runner:
            outcomes = to_batch_outcome(batch, await runner.execute(batch)).outcomes
    for index, outcome in enumerate(outcomes):
        if index in bad:
            assert outcome.disposition == DISPOSITION_PUBLISH_ERROR_AND_ACK
            assert outcome.error_code == codes.QUEUE_INFERENCE_ERROR and outcome.retry_after_s is None
            assert f"'{MODEL}'" in outcome.error and "(TypeError)" in outcome.error
            assert INTERNALS not in outcome.error and "onnxruntime" not in outcome.error
        else:
            assert outcome.disposition == DISPOSITION_PUBLISH_AND_ACK
            assert outcome.result_msgpack.value == {"echo": texts[index]}
    assert len(adapter.calls) <= 2 * size - 1
    if len(bad) == size:
        assert len(adapter.calls) == 2 * size - 1  # the bound is reached when every item fails
    tracebacks = [record.getMessage() for record in caplog.records if record.exc_info]
    assert tracebacks == [f"item r.{index} of batch 7 of {MODEL} failed" for index in sorted(bad)]


async def test_usage_records_the_items_and_seconds_of_the_calls_that_returned() -> None:
    adapter = Picky({"text 1"})
    async with _runner(adapter) as runner:
        await runner.execute(_batch([f"text {index}" for index in range(4)]))
        usage = runner.usage[MODEL]
        assert (usage.batches, usage.items) == (1, 3)
        assert usage.compute_seconds > 0
        await runner.execute(_batch(["text 1"]))
        assert (usage.batches, usage.items) == (1, 3)  # nothing succeeded: nothing recorded


async def test_an_item_that_cannot_allocate_alone_is_resource_exhausted_and_its_batch_mates_succeed() -> None:
    adapter = Picky({"huge"}, error=MemoryError, message="std::bad_alloc")
    batch = _batch(["a", "huge", "b"])
    async with _runner(adapter) as runner:
        first, huge, last = to_batch_outcome(batch, await runner.execute(batch)).outcomes
    assert first.disposition == last.disposition == DISPOSITION_PUBLISH_AND_ACK
    assert huge.disposition == DISPOSITION_PUBLISH_ERROR_AND_ACK
    assert (huge.error_code, huge.retry_after_s) == (codes.RESOURCE_EXHAUSTED, RESOURCE_EXHAUSTED_RETRY_AFTER_S)
    assert "out of memory" in huge.error and "bad_alloc" not in huge.error
