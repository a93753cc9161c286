"""The batch execution API: one RunBatch (one model, one operation) through the model's adapter,
off the event loop, answered with one outcome per item.

`execute` returns Python results; `to_batch_outcome` frames them as the IPC BatchOutcome the sidecar
expects, each item's result as a ResultBody value that is packed only if it crosses the IPC socket (in
`--role all` it never is). An adapter call that raises fails only the items that fail on their own (the
batch runs again in halves, see `BatchRunner._run`). The runner also measures what each model's batches cost
(ModelUsage), which the sidecar's placement reads through ModelControlStatus. With tracing on, each batch is a
`worker.run_batch` span continuing the context its IPC items carry. Memory a large run freed goes back to the OS
once no batch has run for IDLE_TRIM_DELAY_S (`sie.worker.run_memory.FreedHeap`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import attrs

from sie.telemetry.tracing import SERVER_SPAN, WORKER_RUN_BATCH, Tracing, mark_failed
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
from sie.worker.run_memory import PROCESS_HEAP

logger = logging.getLogger(__name__)

NOT_LOADED_NAK_DELAY_MS = 1000
# Contracts Part A §2.1 "Hash gate": work for another config comes back for redelivery after 5 s.
HASH_GATE_NAK_DELAY_MS = 5000
_OPERATIONS = (OP_ENCODE, OP_SCORE, OP_EXTRACT)
# How onnxruntime (CPU arena, CUDA) and the C++ runtime word a failed allocation.
_ALLOCATION_FAILURES = ("failed to allocate", "bad_alloc", "out of memory", "cudaerrormemoryallocation")
# Retry-After of an item that could not allocate even alone.
RESOURCE_EXHAUSTED_RETRY_AFTER_S = 5


def allocation_failure(exc: BaseException) -> bool:
    """Whether an adapter failure is the runtime running out of memory (the batch may fit in smaller parts)."""
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or any(words in text for words in _ALLOCATION_FAILURES)


# Weight of the newest batch in a model's cost-per-item average: a few batches follow a change of load.
COST_EMA_WEIGHT = 0.2
# How long the runner waits without a batch, after a large run, before handing the freed heap back: longer than
# the gap between batches under load (the next batch reuses those pages), short next to an operator's patience.
IDLE_TRIM_DELAY_S = 1.0


@attrs.frozen
class ExecutedBatch:
    """A batch's per-item results in request order, or one reason every item is NAKed for retry or failed."""

    results: BatchResult | None = None
    nak_reason: str | None = None
    error: str | None = None
    error_code: str | None = None
    nak_delay_ms: int = NOT_LOADED_NAK_DELAY_MS


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


@attrs.frozen
class _Completed:
    """What a batch's adapter calls produced: per-item results in order, and the items and seconds of the
    calls that returned (the work ModelUsage records; a call that raised is not counted)."""

    results: BatchResult
    items_run: int
    seconds: float


class BatchRunner:
    """Runs batches on the manager's loaded models; the adapter call happens in `executor`. `usage` holds each
    model's measured cost by model id. Once `idle_trim_delay_s` pass without a batch after a large run, the memory
    it freed is handed back (`PROCESS_HEAP`), on `executor` between runs."""

    def __init__(
        self,
        manager: ModelManager,
        executor: Executor | None = None,
        tracing: Tracing | None = None,
        idle_trim_delay_s: float = IDLE_TRIM_DELAY_S,
    ) -> None:
        self.manager = manager
        self.executor = executor
        self.usage: dict[str, ModelUsage] = {}
        self._tracing = tracing or Tracing.off()
        self._idle_trim_delay_s = idle_trim_delay_s
        self._running = 0
        self._idle_trim: asyncio.TimerHandle | None = None

    async def _run(
        self, method: Callable[[list[Any]], BatchResult], items: list[Any], request: RunBatchRequest
    ) -> _Completed:
        """Run the adapter call in the executor. A call over several items that raises runs again in halves,
        recursively, so an item that fails alone gets its own error and its batch-mates their results: one
        bad item never fails its neighbours (issue 14 §1), and a batch that cannot allocate fits in smaller
        parts (issue 13 §1).

        Only a call that raises is split, into two, so the calls form a binary tree with at most N leaves: an
        N-item batch costs at most 2N-1 adapter calls however many of its items fail.
        """
        try:
            results, seconds = await asyncio.get_running_loop().run_in_executor(self.executor, _timed, method, items)
            return _Completed(results, len(items), seconds)
        except Exception as exc:  # noqa: BLE001 - an adapter failure becomes errors of the items causing it
            if len(items) == 1:
                logger.exception(
                    "item %s of batch %s of %s failed", items[0].work_item_id, request.batch_id, request.model_id
                )
                return _Completed(BatchResult([_item_failed(exc, request.model_id)]), 0, 0.0)
            reason = "could not allocate" if allocation_failure(exc) else type(exc).__name__
            logger.warning(
                "%d items of batch %s of %s failed together (%s); running them in halves",
                len(items), request.batch_id, request.model_id, reason,
            )  # fmt: skip
        half = len(items) // 2
        first = await self._run(method, items[:half], request)
        second = await self._run(method, items[half:], request)
        return _Completed(
            _joined(first.results, second.results), first.items_run + second.items_run, first.seconds + second.seconds
        )

    @property
    def compute_seconds_total(self) -> float:
        """Device-seconds spent running batches since this worker started."""
        return sum(usage.compute_seconds for usage in self.usage.values())

    async def execute(self, request: RunBatchRequest) -> ExecutedBatch:
        """Run one batch on its model: per-item results, or why none ran; with tracing on, in a
        `worker.run_batch` span continuing its items' traces."""
        with self._tracing.span(WORKER_RUN_BATCH, request.items, kind=SERVER_SPAN) as span:
            traced = span.is_recording()
            if traced:
                span.set_attributes(_batch_attributes(request))
            self._batch_started()
            try:
                executed = await self._execute(request)
            finally:
                self._batch_ended()
            results = executed.results
            if results is None:
                mark_failed(span, "not run")
            elif traced:
                span.set_attributes({"sie.tokenization_ms": results.tokenization_ms,
                                     "sie.inference_ms": results.inference_ms,
                                     "sie.postprocessing_ms": results.postprocessing_ms})  # fmt: skip
            return executed

    def _batch_started(self) -> None:
        self._running += 1
        if self._idle_trim is not None:
            self._idle_trim.cancel()
            self._idle_trim = None

    def _batch_ended(self) -> None:
        self._running -= 1
        if self._running == 0 and PROCESS_HEAP.pending and self._idle_trim is None:
            loop = asyncio.get_running_loop()
            self._idle_trim = loop.call_later(self._idle_trim_delay_s, self._trim_when_idle)

    def _trim_when_idle(self) -> None:
        self._idle_trim = None
        if self._running or not PROCESS_HEAP.pending:
            return
        try:
            asyncio.get_running_loop().run_in_executor(self.executor, PROCESS_HEAP.release)
        except RuntimeError:  # the executor has shut down: the process is exiting
            logger.debug("no heap trim: the executor is shut down")

    async def _execute(self, request: RunBatchRequest) -> ExecutedBatch:
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
        if not items:  # nothing to run, and nothing `_run` could split
            return ExecutedBatch(results=BatchResult([]))
        completed = await self._run(method, items, request)
        if completed.items_run:
            self.usage.setdefault(loaded.model_id, ModelUsage()).record(completed.items_run, completed.seconds)
        return ExecutedBatch(results=completed.results)


def _item_failed(exc: Exception, model_id: str) -> ItemResult:
    """An item whose adapter call raised even alone, as the caller sees it: the model and the exception type,
    never the exception's text (it may hold runtime internals such as source paths; the log has it)."""
    if allocation_failure(exc):
        return ItemResult(
            error=f"Model '{model_id}' ran out of memory on this item alone; retry later or send shorter input",
            error_code=codes.RESOURCE_EXHAUSTED,
        )
    return ItemResult(
        error=f"Model '{model_id}' failed on this item ({type(exc).__name__}); the worker log has the details",
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
    exhausted = result.error_code == codes.RESOURCE_EXHAUSTED
    return ItemOutcome(
        work_item_id=item.work_item_id,
        request_id=item.request_id,
        item_index=item.item_index,
        disposition=DISPOSITION_PUBLISH_ERROR_AND_ACK,
        error=result.error,
        error_code=result.error_code,
        retry_after_s=RESOURCE_EXHAUSTED_RETRY_AFTER_S if exhausted else None,
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
            )
        )
    return BatchOutcome(outcomes=outcomes)


def _batch_attributes(request: RunBatchRequest) -> dict[str, str | int]:
    """The `worker.run_batch` span's attributes: the model, the batch, its operation and size."""
    op = request.items[0].op if request.items else ""
    return {"sie.model": request.model_id, "sie.batch_id": request.batch_id, "sie.op": op,
            "sie.batch_size": len(request.items)}  # fmt: skip
