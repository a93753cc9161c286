"""WorkResults the sidecar writes itself: error replies for readiness answers, unknown operations, payloads
it cannot fetch and results too large to send, and the translation of a worker's per-item outcome. Pure
functions; publishing belongs to settlement.
"""

from __future__ import annotations

import math
from typing import Final

import attrs

from sie.wire import codes
from sie.wire.ipc_batch import DISPOSITION_PUBLISH_AND_ACK, ItemOutcome
from sie.wire.ipc_control import EnsureModelReadyResponse
from sie.wire.payload import ResultBody
from sie.wire.queue import WorkItem, WorkResult

# Retry-After of a MODEL_LOADING answer once a hold expires (seed 000 §2: the SDK retries it).
MODEL_LOADING_RETRY_AFTER_S: Final = 5


@attrs.frozen
class BatchTimings:
    """Per-batch timings stamped on every result of the batch (milliseconds)."""

    queue_start: float  # unix time the batch was dispatched; queue_ms runs from WorkItem.timestamp to it
    processing_ms: float


def error_result(
    item: WorkItem, code: str, message: str, worker_id: str, *, retry_after_s: int | None = None
) -> WorkResult:
    """A failed item: `error_code` is what the gateway translates (seed 000 §2)."""
    return WorkResult(
        work_item_id=item.work_item_id,
        request_id=item.request_id,
        item_index=item.item_index,
        success=False,
        error=message,
        error_code=code,
        worker_id=worker_id,
        retry_after_s=retry_after_s,
    )


def model_loading_result(item: WorkItem, worker_id: str) -> WorkResult:
    """The answer once a load took longer than the hold: 503 MODEL_LOADING, retry in 5 s."""
    message = f"Model '{item.model_id}' is loading; retry later"
    return error_result(item, codes.MODEL_LOADING, message, worker_id, retry_after_s=MODEL_LOADING_RETRY_AFTER_S)


def load_failed_result(
    item: WorkItem, response: EnsureModelReadyResponse, worker_id: str, permanent: bool
) -> WorkResult:
    """MODEL_LOAD_FAILED with the failure metadata the gateway turns into its 502 body."""
    metadata = {"error_class": response.error_class or "UNKNOWN", "attempts": response.attempts or 1,
                "permanent": permanent}  # fmt: skip
    message = response.error or f"Model '{item.model_id}' failed to load"
    result = error_result(item, codes.MODEL_LOAD_FAILED, message, worker_id)
    return attrs.evolve(result, result_msgpack=ResultBody.of(metadata))


def resource_exhausted_result(item: WorkItem, response: EnsureModelReadyResponse, worker_id: str) -> WorkResult:
    """RESOURCE_EXHAUSTED (an OOM load failure cooling down): the gateway answers 503 with this Retry-After."""
    retry_after = max(1, math.ceil(response.retry_after_s or 0.0))
    message = response.error or f"Model '{item.model_id}' does not fit in memory right now"
    return error_result(item, codes.RESOURCE_EXHAUSTED, message, worker_id, retry_after_s=retry_after)


def payload_too_large_result(result: WorkResult, size: int, limit: int) -> WorkResult:
    """The compact answer for a result that cannot reach the gateway (seed 001): PAYLOAD_TOO_LARGE, with the
    timings kept and the body dropped."""
    message = f"The result is {size} bytes, more than the {limit}-byte broker messages can carry"
    return attrs.evolve(result, success=False, result_msgpack=None, error=message,
                        error_code=codes.PAYLOAD_TOO_LARGE, executed_bundle_config_hash=None)  # fmt: skip


def preparation_failed_result(item: WorkItem, worker_id: str) -> WorkResult:
    """The answer for an item the sidecar could not prepare (a bug, logged with its traceback): redelivering it
    would fail the same way, so it is answered, without internals."""
    message = f"The worker could not prepare item {item.item_index} of this request; the failure is logged"
    return error_result(item, codes.INTERNAL_ERROR, message, worker_id)


def unknown_operation_result(item: WorkItem, worker_id: str) -> WorkResult:
    message = f"Unknown operation {item.operation!r}; expected encode, score, extract, generate, tokenize or decode"
    return error_result(item, codes.INVALID_INPUT, message, worker_id)


def outcome_result(item: WorkItem, outcome: ItemOutcome, timings: BatchTimings, worker_id: str,
                   prep_ms: float, verified_hash: str | None = None) -> WorkResult:  # fmt: skip
    """The WorkResult of one item the worker answered (publish_and_ack or publish_error_and_ack).

    A successful item echoes `verified_hash` (the hash the gate matched to the worker's) as
    `executed_bundle_config_hash`; the IPC ItemOutcome carries no hash of its own.
    """
    success = outcome.disposition == DISPOSITION_PUBLISH_AND_ACK and outcome.result_msgpack is not None
    error, error_code = None, None
    if not success:
        error_code = outcome.error_code or codes.QUEUE_INFERENCE_ERROR
        error = outcome.error or _missing_result_reason(outcome)
    return WorkResult(
        work_item_id=item.work_item_id,
        request_id=item.request_id,
        item_index=item.item_index,
        success=success,
        result_msgpack=outcome.result_msgpack if success else None,
        error=error,
        error_code=error_code,
        inference_ms=outcome.inference_ms,
        queue_ms=max(0.0, (timings.queue_start - item.timestamp) * 1000.0),
        processing_ms=timings.processing_ms,
        worker_id=worker_id,
        tokenization_ms=prep_ms + outcome.tokenization_ms,
        postprocessing_ms=outcome.postprocessing_ms,
        units=outcome.units,
        executed_bundle_config_hash=verified_hash if success else None,
        retry_after_s=outcome.retry_after_s,
    )


def _missing_result_reason(outcome: ItemOutcome) -> str:
    if outcome.disposition == DISPOSITION_PUBLISH_AND_ACK and outcome.raw_output is not None:
        # Our worker frames public bytes itself; raw_output framing (the Rust sidecar's job) is not built.
        return "the worker returned raw_output, which this sidecar does not frame"
    if outcome.disposition == DISPOSITION_PUBLISH_AND_ACK:
        return "the worker returned no result"
    return f"the worker failed the item ({outcome.disposition})"
