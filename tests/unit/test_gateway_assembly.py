"""Results → bodies and the failure rules (seed 000 §2; contracts Part B §1.2–1.4, §1.10, §10.4)."""

from __future__ import annotations

import numpy as np
import pytest

from sie.gateway import assembly
from sie.gateway.errors import (
    AllItemsFailedError,
    InvalidRequestError,
    ModelLoadFailedError,
    WorkerRetryableError,
)
from sie.wire import packb
from sie.wire.http import Item
from sie.wire.queue import WorkResult


def ok(index: int, payload: object) -> WorkResult:
    return WorkResult(
        work_item_id=f"r.{index}", request_id="r", item_index=index, success=True, result_msgpack=packb(payload)
    )


def fail(index: int, code: str | None, error: str = "boom", **fields: object) -> WorkResult:
    return WorkResult(
        work_item_id=f"r.{index}", request_id="r", item_index=index, success=False, error=error, error_code=code,
        **fields,
    )  # fmt: skip


def dense(*values: float) -> dict:
    return {"dense": {"dims": len(values), "dtype": "float32", "values": np.array(values, dtype=np.float32)}}


def test_no_failures() -> None:
    assert assembly.check_failures([ok(0, {}), ok(1, {})]) == []


def test_partial_failure_returns_the_failed_positions() -> None:
    assert assembly.check_failures([ok(0, {}), fail(1, "inference_error")]) == [1]


@pytest.mark.parametrize("code", ["INVALID_INPUT", "INPUT_TOO_LONG"])
def test_any_input_error_fails_the_request_naming_the_item(code: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        assembly.check_failures([ok(0, {}), fail(1, code, "Input is 900 tokens; the limit is 256")])
    assert (caught.value.code, caught.value.message) == (code, "Item 1: Input is 900 tokens; the limit is 256")


def test_score_input_error_keeps_the_workers_message() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        assembly.check_failures([fail(0, "INVALID_INPUT", "query has no text")], per_item=False)
    assert caught.value.message == "query has no text"


@pytest.mark.parametrize("code", ["MODEL_LOADING", "LORA_LOADING", "RESOURCE_EXHAUSTED"])
def test_one_retryable_code_everywhere_is_a_retry(code: str) -> None:
    with pytest.raises(WorkerRetryableError) as caught:
        assembly.check_failures([fail(0, code, "wait"), fail(1, code, "wait")])
    assert (caught.value.code, caught.value.retry_after_s) == (code, 5)


@pytest.mark.parametrize(("hints", "expected"), [((12, 3), 12), ((0, None), 5), ((61, 90), 5), ((True, 7), 7)])
def test_resource_exhausted_retry_after_uses_valid_worker_hints(hints: tuple, expected: int) -> None:
    results = [fail(i, "RESOURCE_EXHAUSTED", retry_after_s=hint) for i, hint in enumerate(hints)]
    with pytest.raises(WorkerRetryableError) as caught:
        assembly.check_failures(results)
    assert caught.value.retry_after_s == expected


def test_worker_retry_hint_is_ignored_for_other_codes() -> None:
    with pytest.raises(WorkerRetryableError) as caught:
        assembly.check_failures([fail(0, "MODEL_LOADING", retry_after_s=30)])
    assert caught.value.retry_after_s == 5


def test_all_model_load_failed_carries_the_worker_metadata() -> None:
    metadata = packb({"error_class": "GATED", "attempts": 2, "permanent": True})
    with pytest.raises(ModelLoadFailedError) as caught:
        assembly.check_failures([fail(0, "MODEL_LOAD_FAILED", "gated repo", result_msgpack=metadata)])
    assert caught.value.extra == {"error_class": "GATED", "attempts": 2, "permanent": True}
    assert caught.value.message == "gated repo"


def test_model_load_failed_without_metadata_is_synthesised_conservatively() -> None:
    with pytest.raises(ModelLoadFailedError) as caught:
        assembly.check_failures([fail(0, "MODEL_LOAD_FAILED"), fail(1, "MODEL_LOAD_FAILED", result_msgpack=b"\xc1")])
    assert caught.value.extra == {"error_class": "UNKNOWN", "attempts": 1, "permanent": False}


def test_mixed_codes_are_all_items_failed_with_details() -> None:
    with pytest.raises(AllItemsFailedError) as caught:
        assembly.check_failures([fail(0, "MODEL_LOADING", "a"), fail(1, "RESOURCE_EXHAUSTED", "b"), fail(2, None, "c")])
    assert caught.value.details == [
        {"item_index": 0, "error": "a", "code": "MODEL_LOADING"},
        {"item_index": 1, "error": "b", "code": "RESOURCE_EXHAUSTED"},
        {"item_index": 2, "error": "c"},
    ]


def test_strict_mode_classifies_a_partial_failure_like_a_full_one() -> None:
    with pytest.raises(WorkerRetryableError):
        assembly.check_failures([ok(0, {}), fail(1, "MODEL_LOADING")], strict=True)


def test_encode_body_echoes_ids_only_when_sent_and_keeps_alignment() -> None:
    items = [Item(id="doc-1", text="a"), Item(text="b"), Item(id="doc-3", text="c")]
    results = [ok(0, dense(1.0)), fail(1, "inference_error", "kaput"), ok(2, {**dense(3.0), "extra": 1})]
    body = assembly.encode_body("m", items, results, [1])
    assert body["model"] == "m"
    first, second, third = body["items"]
    assert first["id"] == "doc-1" and first["dense"]["values"].tolist() == [1.0]
    assert second == {"error": {"code": "inference_error", "message": "kaput"}}
    assert set(third) == {"id", "dense"}
    assert body["errors"] == [{"item_index": 1, "error": "kaput", "code": "inference_error"}]


def test_encode_body_without_failures_has_no_errors_key() -> None:
    body = assembly.encode_body("m", [Item(text="a")], [ok(0, dense(1.0))])
    assert set(body) == {"model", "items"} and "id" not in body["items"][0]


def test_extract_body_always_has_ids_and_the_five_fields() -> None:
    entity = {"text": "Tim", "label": "person", "score": 0.9, "start": 0, "end": 3, "bbox": None}
    results = [ok(0, {"entities": [entity]}), fail(1, "inference_error")]
    body = assembly.extract_body("m", [Item(text="Tim"), Item(id="x", text="y")], results, [1])
    assert body["items"][0] == {
        "id": "item-0", "entities": [entity], "relations": [], "classifications": [], "objects": [], "data": {},
    }  # fmt: skip
    assert body["items"][1]["id"] == "x" and body["items"][1]["entities"] == []
    assert body["items"][1]["error"]["code"] == "inference_error"


def test_score_body_sorts_and_ranks() -> None:
    entries = [
        {"item_id": "item-0", "score": 0.9, "rank": 9},
        {"item_id": "item-1", "score": 0.1, "rank": 9},
        {"item_id": "doc-2", "score": 0.5, "rank": 9},
        {"item_id": "item-3", "score": 0.3, "rank": 9},
    ]
    body = assembly.score_body("m", "q", ok(0, entries))
    assert body["query_id"] == "q"
    assert [(s["item_id"], s["rank"]) for s in body["scores"]] == [
        ("item-0", 0), ("doc-2", 1), ("item-3", 2), ("item-1", 3),
    ]  # fmt: skip


def test_a_corrupt_worker_result_is_a_bug_not_a_bad_request() -> None:
    corrupt = WorkResult(work_item_id="r.0", request_id="r", item_index=0, success=True, result_msgpack=b"\xc1")
    with pytest.raises(RuntimeError, match="this is a bug"):
        assembly.encode_body("m", [Item(text="a")], [corrupt])
    missing = WorkResult(work_item_id="r.0", request_id="r", item_index=0, success=True)
    with pytest.raises(RuntimeError, match="this is a bug"):
        assembly.decode_result(missing)
