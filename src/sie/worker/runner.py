"""The batch execution API: one RunBatch (one model, one operation) through the model's adapter,
off the event loop, answered with one outcome per item.

`execute` returns Python results; `to_batch_outcome` frames them as the IPC BatchOutcome the sidecar
expects, each item's result as a ResultBody value that is packed only if it crosses the IPC socket (in
`--role all` it never is). The runner also measures what each model's batches cost (ModelUsage), which the
sidecar's placement reads through ModelControlStatus.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import attrs

from sie.wire import codes
from sie.wire.ipc_batch import (
    DISPOSITION_NAK_RETRY,
    DISPOSITION_PUBLISH_AND_ACK,
    DISPOSITION_PUBLISH_ERROR_AND_ACK,
    OP_ENCODE,
    OP_EXTRACT,
    OP_SCORE,
    BatchOutcome,
    ItemOutcome,
    RunBatchRequest,
)
from sie.wire.payload import ResultBody
from sie.wire.queue import UnitCounts
from sie.worker.adapters import BatchResult, ItemResult
from sie.worker.manager import ModelManager

logger = logging.getLogger(__name__)

NOT_LOADED_NAK_DELAY_MS = 1000
# Contracts Part A §2.1 "Hash gate": work for another config comes back for redelivery after 5 s.
HASH_GATE_NAK_DELAY_MS = 5000
_OPERATIONS = (OP_ENCODE, OP_SCORE, OP_EXTRACT)
# How onnxruntime (CPU arena, CUDA) and the C++ runtime word a failed allocation.
_ALLOCATION_FAILURES = ("failed to allocate", "bad_alloc", "out of memory", "cudaerrormemoryallocation")
# Retry-After of a batch that could not allocate even one item at a time.
RESOURCE_EXHAUSTED_RETRY_AFTER_S = 5


def allocation_failure(exc: BaseException) -> bool:
    """Whether an adapter failure is the runtime running out of memory (the batch may fit in smaller parts)."""
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or any(words in text for words in _ALLOCATION_FAILURES)


# Weight of the newest batch in a model's cost-per-item average: a few batches follow a change of load.
COST_EMA_WEIGHT = 0.2


@attrs.frozen
class ExecutedBatch:
    """A batch's per-item results in request order, or one reason every item is NAKed for retry."""

    results: BatchResult | None = None
    nak_reason: str | None = None
    error: str | None = None
    error_code: str | None = None
    nak_delay_ms: int = NOT_LOADED_NAK_DELAY_MS
    retry_after_s: int | None = None


def item_hashes(request: RunBatchRequest) -> list[str]:
    """The non-empty `bundle_config_hash` of every item body (encode, score or extract) of a batch."""
    hashes = []
    for item in request.items:
        body = item.encode or item.score or item.extract
        digest = getattr(body, "bundle_config_hash", None)
        if digest:
            hashes.append(digest)
    return hashes


def hash_gate(request: RunBatchRequest, current: str) -> ExecutedBatch | None:
    """The whole batch NAKed (5 s, no error code) when any item names a hash other than `current`; else None.

    Empty or missing hashes are accepted (legacy traffic).
    """
    stale = [digest for digest in item_hashes(request) if digest != current]
    if not stale:
        return None
    reason = f"bundle_config_hash {stale[0]!r} is not this worker's current {current!r}"
    return ExecutedBatch(nak_reason=reason, nak_delay_ms=HASH_GATE_NAK_DELAY_MS)


@attrs.define
class ModelUsage:
    """What one model's batches have cost on this worker since it started: counts, device-seconds, and the
    seconds per item as an exponential moving average (None until a batch has run)."""

    batches: int = 0
    items: int = 0
    compute_seconds: float = 0.0
    cost_per_item_s: float | None = None

    def record(self, items: int, seconds: float) -> None:
        self.batches += 1
        self.items += items
        self.compute_seconds += seconds
        sample = seconds / max(1, items)
        previous = self.cost_per_item_s
        self.cost_per_item_s = sample if previous is None else previous + COST_EMA_WEIGHT * (sample - previous)


def _timed(method: Callable[[list[Any]], BatchResult], items: list[Any]) -> tuple[BatchResult, float]:
    """Run on the executor's thread, so the time excludes waiting for it behind another batch."""
    started = time.perf_counter()
    results = method(items)
    return results, time.perf_counter() - started


class BatchRunner:
    """Runs batches on the manager's loaded models; the adapter call happens in `executor`. `usage` holds each
    model's measured cost by model id."""

    def __init__(self, manager: ModelManager, executor: Executor | None = None) -> None:
        self.manager = manager
        self.executor = executor
        self.usage: dict[str, ModelUsage] = {}

    async def _run(
        self, method: Callable[[list[Any]], BatchResult], items: list[Any], model_id: str
    ) -> tuple[BatchResult, float]:
        """Run the adapter call in the executor; a batch that cannot allocate runs again in halves, down to
        single items (issue 13 §1: a worker allocation failure splits the batch, it is not a 500)."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, _timed, method, items)
        except Exception as exc:
            if len(items) == 1 or not allocation_failure(exc):
                raise
            logger.warning("a batch of %d items of %s could not allocate; running it in halves", len(items), model_id)
        half = len(items) // 2
        first, first_s = await self._run(method, items[:half], model_id)
        second, second_s = await self._run(method, items[half:], model_id)
        return _joined(first, second), first_s + second_s

    @property
    def compute_seconds_total(self) -> float:
        """Device-seconds spent running batches since this worker started."""
        return sum(usage.compute_seconds for usage in self.usage.values())

    async def execute(self, request: RunBatchRequest) -> ExecutedBatch:
        ops = {item.op for item in request.items}
        if len(ops) > 1:
            return ExecutedBatch(error="run_batch_mixed_op", error_code=codes.QUEUE_INFERENCE_ERROR)
        op = ops.pop() if ops else OP_ENCODE
        if op not in _OPERATIONS:
            return ExecutedBatch(error="run_batch_unknown_op", error_code=codes.QUEUE_INFERENCE_ERROR)
        loaded = self.manager.get(request.model_id)
        if loaded is None:
            return ExecutedBatch(nak_reason=f"Model '{request.model_id}' is not loaded on this worker")
        method = getattr(loaded.adapter, op)
        items = [getattr(item, op) for item in request.items]
        if any(item is None for item in items):
            return ExecutedBatch(error=f"RunBatch item without its {op} body", error_code=codes.QUEUE_INFERENCE_ERROR)
        try:
            results, seconds = await self._run(method, items, request.model_id)
        except Exception as exc:  # noqa: BLE001 - an adapter failure becomes per-item errors, never a crash
            logger.exception("batch %s of %s failed", request.batch_id, request.model_id)
            return _failed(exc, request.model_id)
        self.usage.setdefault(loaded.model_id, ModelUsage()).record(len(items), seconds)
        return ExecutedBatch(results=results)


def _failed(exc: Exception, model_id: str) -> ExecutedBatch:
    """A failed batch as the caller sees it: no runtime internals (the log has them)."""
    if allocation_failure(exc):
        return ExecutedBatch(
            error=f"Model '{model_id}' ran out of memory even one item at a time; retry later or send shorter input",
            error_code=codes.RESOURCE_EXHAUSTED,
            retry_after_s=RESOURCE_EXHAUSTED_RETRY_AFTER_S,
        )
    return ExecutedBatch(
        error=f"Model '{model_id}' failed to run this batch ({type(exc).__name__}); the worker log has the details",
        error_code=codes.QUEUE_INFERENCE_ERROR,
    )


def _joined(first: BatchResult, second: BatchResult) -> BatchResult:
    return BatchResult(
        items=[*first.items, *second.items],
        tokenization_ms=first.tokenization_ms + second.tokenization_ms,
        inference_ms=first.inference_ms + second.inference_ms,
        postprocessing_ms=first.postprocessing_ms + second.postprocessing_ms,
    )


def _outcome(item: Any, result: ItemResult, batch: BatchResult) -> ItemOutcome:
    timings = {
        "inference_ms": batch.inference_ms,
        "tokenization_ms": batch.tokenization_ms,
        "postprocessing_ms": batch.postprocessing_ms,
        "units": UnitCounts(input_tokens=result.input_tokens),
    }
    if result.ok:
        return ItemOutcome(
            work_item_id=item.work_item_id,
            request_id=item.request_id,
            item_index=item.item_index,
            disposition=DISPOSITION_PUBLISH_AND_ACK,
            result_msgpack=ResultBody.of(result.result),
            **timings,
        )
    return ItemOutcome(
        work_item_id=item.work_item_id,
        request_id=item.request_id,
        item_index=item.item_index,
        disposition=DISPOSITION_PUBLISH_ERROR_AND_ACK,
        error=result.error,
        error_code=result.error_code,
        **timings,
    )


def to_batch_outcome(request: RunBatchRequest, executed: ExecutedBatch) -> BatchOutcome:
    """Frame an executed batch as the IPC response: public result bytes per item."""
    outcomes = []
    for index, item in enumerate(request.items):
        if executed.results is not None:
            outcomes.append(_outcome(item, executed.results.items[index], executed.results))
            continue
        nak = executed.nak_reason is not None
        outcomes.append(
            ItemOutcome(
                work_item_id=item.work_item_id,
                request_id=item.request_id,
                item_index=item.item_index,
                disposition=DISPOSITION_NAK_RETRY if nak else DISPOSITION_PUBLISH_ERROR_AND_ACK,
                nak_delay_ms=executed.nak_delay_ms if nak else 0,
                error=executed.nak_reason or executed.error,
                error_code=None if nak else executed.error_code,
                retry_after_s=None if nak else executed.retry_after_s,
            )
        )
    return BatchOutcome(outcomes=outcomes)
