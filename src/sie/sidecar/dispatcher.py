"""Dispatch: one formed batch becomes one RunBatch on the worker; its per-item outcomes become WorkResults
that settlement publishes (one flush per batch) before the ACKs. A failed IPC call NAKs the whole batch
for redelivery. Finishing (framing, publishing, settling) overlaps the next batch on the worker. With tracing on,
a batch's wait and its IPC call are spans (`sidecar.batch_wait`, `sidecar.dispatch`) in its items' traces, and the
IPC items carry the dispatch span's context so the worker's span nests under it (seed 000 §15.1).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable

import attrs

from sie.ipc.client import WorkerClient
from sie.sidecar.results import BatchTimings, outcome_result
from sie.sidecar.scheduler import Batch
from sie.sidecar.settlement import Settler, outcome_nak_delay
from sie.sidecar.work import Work
from sie.telemetry.tracing import (
    CLIENT_SPAN,
    SIDECAR_BATCH_WAIT,
    SIDECAR_DISPATCH,
    Span,
    TraceHeaders,
    Tracing,
    epoch_ns,
    mark_failed,
)
from sie.wire.ipc_batch import BatchOutcome, ItemOutcome, RunBatchRequest
from sie.wire.queue import WorkResult

logger = logging.getLogger(__name__)

_FINISH_QUEUE_BATCHES = 8
_CLOSE_TIMEOUT_S = 5.0


@attrs.define
class _Finished:
    batch: Batch
    outcome: BatchOutcome | None
    timings: BatchTimings


class BatchDispatcher:
    """Runs batches on one worker and hands their outcomes to settlement through a bounded queue.

    `on_unready(model_id)` hears of a model the worker could not run (not loaded, or the call failed), so
    readiness asks the worker again before its next work.
    """

    def __init__(
        self,
        worker: WorkerClient,
        settler: Settler,
        on_unready: Callable[[str], None],
        worker_id: str,
        nak_delay_s: float,
        tracing: Tracing | None = None,
    ) -> None:
        self._worker = worker
        self._tracing = tracing or Tracing.off()
        self._settler = settler
        self._on_unready = on_unready
        self._worker_id = worker_id
        self._nak_delay_s = nak_delay_s
        self._batch_ids = itertools.count(1)
        self._finished: asyncio.Queue[_Finished] = asyncio.Queue(maxsize=_FINISH_QUEUE_BATCHES)
        self._task: asyncio.Task[None] | None = None
        self.batches = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._finish_loop(), name="sie-sidecar-finish")

    async def close(self) -> None:
        """Finish what is queued (for a bounded time), then stop."""
        if self._task is None:
            return
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                await self._finished.join()
        except TimeoutError:
            logger.warning("results of %d batches were not settled before shutdown", self._finished.qsize())
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None

    async def dispatch(self, batch: Batch) -> None:
        """Send one batch and wait for the worker's answer (not for its publication)."""
        batch.works = await self._settler.live(batch.works)  # immediately before IPC: abandoned work is not run
        if not batch.works:
            return
        request = RunBatchRequest(
            model_id=batch.model.model_id,
            batch_id=next(self._batch_ids),
            lora_key=batch.lora_key,
            total_cost=batch.cost,
            items=[work.run_item for work in batch.works],
        )
        with self._tracing.span(SIDECAR_DISPATCH, batch.works, kind=CLIENT_SPAN) as span:
            carried = self._tracing.headers(span)
            if carried is not None:  # tracing is on: the worker continues this span's trace
                request = self._traced_request(batch, request, span, carried)
            outcome, timings = await self._run(request)
            if outcome is None:
                mark_failed(span, "RunBatch failed")
        self.batches += 1
        batch.inference_s = _model_seconds(outcome)  # for the scheduler's batch metrics
        await self._finished.put(_Finished(batch, outcome, timings))

    async def _run(self, request: RunBatchRequest) -> tuple[BatchOutcome | None, BatchTimings]:
        """The worker's answer (None when the call failed) and how long the call took."""
        queue_start = time.time()
        started = time.perf_counter()
        outcome: BatchOutcome | None
        try:
            outcome = await self._worker.run_batch(request)
        except Exception:  # noqa: BLE001 - any IPC failure is transient for the items: they are NAKed
            logger.warning("RunBatch %d of %s failed; NAKing %d items", request.batch_id, request.model_id,
                           len(request.items), exc_info=True)  # fmt: skip
            outcome = None
        timings = BatchTimings(queue_start=queue_start, processing_ms=(time.perf_counter() - started) * 1000.0)
        return outcome, timings

    def _traced_request(
        self, batch: Batch, request: RunBatchRequest, span: Span, carried: TraceHeaders
    ) -> RunBatchRequest:
        """Record the batch's wait since preparation as a span in its items' traces, describe the dispatch `span`,
        and return `request` with its items carrying that span's context."""
        attributes = {"sie.model": request.model_id, "sie.op": batch.op, "sie.batch_id": request.batch_id,
                      "sie.batch_size": len(batch.works), "sie.batch_cost": batch.cost}  # fmt: skip
        waited_since = min(work.prepared for work in batch.works)
        self._tracing.start(SIDECAR_BATCH_WAIT, batch.works, attributes, start_ns=epoch_ns(waited_since)).end()
        span.set_attributes(attributes)
        return attrs.evolve(request, items=[
            attrs.evolve(item, traceparent=carried.traceparent, tracestate=carried.tracestate)
            for item in request.items
        ])  # fmt: skip

    async def _finish_loop(self) -> None:
        while True:
            finished = await self._finished.get()
            try:
                await self._finish(finished)
            except Exception:  # noqa: BLE001 - a framing bug must not stop settlement of later batches
                logger.exception("finishing a batch of %s failed", finished.batch.model.model_id)
                await self._settler.nak(finished.batch.works, self._nak_delay_s)
            finally:
                self._finished.task_done()

    async def _finish(self, finished: _Finished) -> None:
        batch, outcome = finished.batch, finished.outcome
        if outcome is None:
            self._unready(batch.model.model_id)
            await self._settler.nak(batch.works, self._nak_delay_s)
            return
        replies: list[tuple[Work, WorkResult]] = []
        naks: dict[float, list[Work]] = {}
        live = await self._settler.live(batch.works)  # before publish: nobody reads an abandoned result
        if len(live) != len(batch.works):
            outcome = _outcomes_of(live, _pair(batch.works, outcome.outcomes))
            batch.works = live
        for work, item_outcome in _pair(batch.works, outcome.outcomes):
            delay = self._nak_delay_s if item_outcome is None else outcome_nak_delay(item_outcome)
            if delay is not None:
                naks.setdefault(delay, []).append(work)
                continue
            result = outcome_result(work.item, item_outcome, finished.timings, self._worker_id, work.prep_ms,
                                    work.verified_hash)  # fmt: skip
            replies.append((work, result))
        if replies:
            await self._settler.reply(replies)
        if naks:
            self._unready(batch.model.model_id)
            for delay, works in naks.items():
                await self._settler.nak(works, delay)

    def _unready(self, model_id: str) -> None:
        self._on_unready(model_id)


def _model_seconds(outcome: BatchOutcome | None) -> float | None:
    """The worker's model time for one batch (its items ran together: the longest), None when the call failed."""
    if outcome is None:
        return None
    return max((item.inference_ms for item in outcome.outcomes), default=0.0) / 1000.0


def _pair(works: list[Work], outcomes: list[ItemOutcome]) -> list[tuple[Work, ItemOutcome | None]]:
    """Outcomes in item order (the contract); matched by work_item_id when the worker reordered or lost some."""
    if len(outcomes) == len(works) and all(
        work.item.work_item_id == outcome.work_item_id for work, outcome in zip(works, outcomes, strict=True)
    ):
        return list(zip(works, outcomes, strict=True))
    by_id = {outcome.work_item_id: outcome for outcome in outcomes}
    return [(work, by_id.get(work.item.work_item_id)) for work in works]


def _outcomes_of(works: list[Work], paired: list[tuple[Work, ItemOutcome | None]]) -> BatchOutcome:
    """The outcomes of `works` only, in their order (the others' works were dropped)."""
    kept = {id(work) for work in works}
    return BatchOutcome(outcomes=[outcome for work, outcome in paired if id(work) in kept and outcome is not None])
