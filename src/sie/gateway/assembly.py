"""Collected WorkResults → response bodies, and the failure rules of seed 000 §2 as typed exceptions.

Bodies follow contracts Part B §1.2–1.4: encode `{"model", "items"}` with `id` echoed only when sent; score
`{"model", "query_id", "scores"}` best first with ranks from 0; extract items always carry `id` and the five
fields. Partial failures keep positional alignment: a failed position holds `{"id"?, "error": {...}}` and the
body lists `errors: [{"item_index", "error", "code"}]`. A result body is read as a value: in `--role all` it
is the worker's own object, across NATS it is unpacked here, once. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from sie.gateway.errors import (
    AllItemsFailedError,
    GatewayError,
    InvalidRequestError,
    ModelLoadFailedError,
    WorkerRetryableError,
)
from sie.wire import DecodeError, codes
from sie.wire.http import Item
from sie.wire.queue import WorkResult

# Worker codes that mean the caller's input was bad: the whole request is a 400 naming the item.
INPUT_ERROR_CODES: Final = frozenset({codes.INVALID_INPUT, codes.INPUT_TOO_LONG})
ENCODE_OUTPUT_KEYS: Final = ("dense", "sparse", "multivector")
EXTRACT_LIST_KEYS: Final = ("entities", "relations", "classifications", "objects")
RETRY_AFTER_RANGE: Final = range(1, 61)
DEFAULT_RETRY_AFTER_S: Final = 5


def check_failures(results: Sequence[WorkResult], *, per_item: bool = True, strict: bool = False) -> list[int]:
    """Indices of failed items when the request still succeeds; raises when it does not.

    Any input error → InvalidRequestError naming the item; every item failed (or any, with `strict`) →
    the all-failed classification. `per_item` is False for score, whose one work item is the whole request.
    """
    failed = [index for index, result in enumerate(results) if not result.success]
    if not failed:
        return failed
    for index in failed:
        result = results[index]
        if result.error_code in INPUT_ERROR_CODES:
            message = result.error or "Invalid input"
            raise InvalidRequestError(f"Item {index}: {message}" if per_item else message, code=result.error_code)
    if strict or len(failed) == len(results):
        raise all_failed_error(results, failed)
    return failed


def all_failed_error(results: Sequence[WorkResult], failed: Sequence[int]) -> GatewayError:
    """One retryable code → 503 retry; all MODEL_LOAD_FAILED → 502; anything else → 500 all_items_failed."""
    first = results[failed[0]]
    failed_codes = {results[index].error_code for index in failed}
    if len(failed_codes) == 1 and first.error_code in codes.RETRYABLE_WORKER_CODES:
        message = first.error or f"Worker reported {first.error_code}"
        return WorkerRetryableError(message, code=first.error_code, retry_after_s=_retry_after(results, failed))
    if failed_codes == {codes.MODEL_LOAD_FAILED}:
        return _load_failed(first)
    details = [_failure(index, results[index]) for index in failed]
    return AllItemsFailedError(f"All {len(failed)} items failed", details)


def _retry_after(results: Sequence[WorkResult], failed: Sequence[int]) -> int:
    # Seed 000 §2: only RESOURCE_EXHAUSTED carries the worker's value, and only an integer in 1..60.
    if results[failed[0]].error_code != codes.RESOURCE_EXHAUSTED:
        return DEFAULT_RETRY_AFTER_S
    hints = [results[index].retry_after_s for index in failed]
    valid = [hint for hint in hints if type(hint) is int and hint in RETRY_AFTER_RANGE]
    return max(valid) if valid else DEFAULT_RETRY_AFTER_S


def _load_failed(result: WorkResult) -> ModelLoadFailedError:
    # The worker may send registry-shaped metadata; otherwise synthesise conservative fields.
    metadata: Any = {}
    if result.result_msgpack is not None:
        try:
            metadata = result.result_msgpack.value
        except DecodeError:
            metadata = {}
    if not isinstance(metadata, dict):
        metadata = {}
    error_class = metadata.get("error_class")
    attempts = metadata.get("attempts")
    permanent = metadata.get("permanent")
    return ModelLoadFailedError(
        result.error or "The model failed to load",
        error_class=error_class if isinstance(error_class, str) else "UNKNOWN",
        attempts=attempts if type(attempts) is int and attempts >= 1 else 1,
        permanent=permanent if isinstance(permanent, bool) else False,
    )


def _failure(index: int, result: WorkResult) -> dict[str, Any]:
    detail: dict[str, Any] = {"item_index": index, "error": result.error or "unknown error"}
    if result.error_code is not None:
        detail["code"] = result.error_code
    return detail


def decode_result(result: WorkResult) -> Any:
    """The public result object of a successful item (arrays as ndarrays)."""
    if result.result_msgpack is None:
        raise RuntimeError(f"successful work result {result.work_item_id} has no result_msgpack; this is a bug")
    try:
        return result.result_msgpack.value
    except DecodeError as exc:
        # A worker's bytes are not the caller's input: this must not become a 400.
        raise RuntimeError(f"work result {result.work_item_id} is not valid msgpack ({exc}); this is a bug") from None


def _error_object(result: WorkResult) -> dict[str, Any]:
    return {"code": result.error_code or codes.INFERENCE_ERROR, "message": result.error or "unknown error"}


def _with_errors(body: dict[str, Any], results: Sequence[WorkResult], failed: Sequence[int]) -> dict[str, Any]:
    if failed:
        body["errors"] = [_failure(index, results[index]) for index in failed]
    return body


def encode_body(
    model: str, items: Sequence[Item], results: Sequence[WorkResult], failed: Sequence[int] = ()
) -> dict[str, Any]:
    """`{"model", "items"}`; `id` only where the request item had one."""
    out = []
    for item, result in zip(items, results, strict=True):
        entry: dict[str, Any] = {} if item.id is None else {"id": item.id}
        if result.success:
            decoded = decode_result(result)
            for key in ENCODE_OUTPUT_KEYS:
                if key in decoded:
                    entry[key] = decoded[key]
        else:
            entry["error"] = _error_object(result)
        out.append(entry)
    return _with_errors({"model": model, "items": out}, results, failed)


def extract_body(
    model: str, items: Sequence[Item], results: Sequence[WorkResult], failed: Sequence[int] = ()
) -> dict[str, Any]:
    """`{"model", "items"}`; every item has `id` (or `item-{i}`), the four lists and `data`."""
    out = []
    for index, (item, result) in enumerate(zip(items, results, strict=True)):
        decoded = decode_result(result) if result.success else {}
        entry: dict[str, Any] = {"id": item.id if item.id is not None else f"item-{index}"}
        for key in EXTRACT_LIST_KEYS:
            entry[key] = decoded.get(key) or []
        entry["data"] = decoded.get("data") or {}
        if not result.success:
            entry["error"] = _error_object(result)
        out.append(entry)
    return _with_errors({"model": model, "items": out}, results, failed)


def score_body(model: str, query_id: str | None, result: WorkResult) -> dict[str, Any]:
    """`{"model", "query_id", "scores"}` sorted by score descending, rank 0 the best."""
    entries = decode_result(result)
    ranked = sorted(entries, key=lambda entry: -entry["score"])
    scores = [{"item_id": entry["item_id"], "score": entry["score"], "rank": rank} for rank, entry in enumerate(ranked)]
    return {"model": model, "query_id": query_id, "scores": scores}


def input_tokens(results: Sequence[WorkResult]) -> int:
    """The tokens the model read for these results (what the compatibility dialects report as usage)."""
    return sum(result.units.input_tokens for result in results if result.units is not None)
