"""Work queue messages (sie.wire.queue)."""

import hashlib

import pytest

from sie.wire import DecodeError, from_msgpack, structure, to_msgpack, unpackb, unstructure
from sie.wire.queue import (
    RESULT_CHUNK_KIND,
    ResultChunkV1,
    UnitCounts,
    WorkItem,
    WorkResult,
    is_result_chunk,
)

REQUIRED = {
    "work_item_id": "abc-123.0",
    "request_id": "abc-123",
    "item_index": 0,
    "total_items": 2,
    "operation": "encode",
    "model_id": "BAAI/bge-m3",
    "profile_id": "default",
    "pool_name": "default",
    "machine_profile": "default",
    "router_id": "gw-1",
    "reply_subject": "_INBOX.gw-1.abc-123",
    "timestamp": 1760000000.0,
}


@pytest.mark.parametrize("field", sorted(REQUIRED))
def test_work_item_required_fields(field):
    data = {key: value for key, value in REQUIRED.items() if key != field}
    with pytest.raises(DecodeError) as caught:
        structure(data, WorkItem)
    assert str(caught.value) == f"Object missing required field `{field}`"


def test_work_item_seed_example_fields():
    # seed 000 §16.2, step 2.
    data = REQUIRED | {
        "admission_pool": "default",
        "item": {"text": "..."},
        "accepts_result_chunks": True,
        "bundle_config_hash": "a1b2c3",
    }
    item = from_msgpack(to_msgpack(structure(data, WorkItem)), WorkItem)
    assert item.admission_pool == "default"
    assert item.accepts_result_chunks is True
    assert item.bundle_config_hash == "a1b2c3"


def test_work_item_defaults_and_omissions():
    item = structure(REQUIRED, WorkItem)
    assert item.is_query is False
    assert item.accepts_result_chunks is False
    # Required fields plus the two booleans: None-valued optionals stay off the wire.
    assert unstructure(item) == REQUIRED | {"is_query": False, "accepts_result_chunks": False}


def test_score_work_item_carries_query_and_candidates():
    data = REQUIRED | {
        "operation": "score",
        "total_items": 1,
        "query_item": {"text": "q"},
        "score_items": [{"text": "a"}, {"id": "w", "text": "b"}],
    }
    item = structure(data, WorkItem)
    assert item.score_items[1] == {"id": "w", "text": "b"}


def test_work_result_minimal_and_full():
    minimal = {"work_item_id": "r.0", "request_id": "r", "item_index": 0, "success": False, "error": "boom"}
    assert unstructure(structure(minimal, WorkResult)) == minimal
    full = structure(
        minimal
        | {
            "success": True,
            "error": None,
            "result_msgpack": b"\x80",
            "units": {"input_tokens": 4},
            "executed_bundle_config_hash": "ab" * 32,
            "retry_after_s": 5,
        },
        WorkResult,
    )
    assert full.units == UnitCounts(input_tokens=4)
    assert full.result_msgpack.packed() == b"\x80"


def test_result_chunk_carries_its_kind_and_binary_digest():
    whole = to_msgpack(
        WorkResult(work_item_id="r.0", request_id="r", item_index=0, success=True, result_msgpack=b"x" * 10)
    )
    chunk = ResultChunkV1(
        request_id="r",
        work_item_id="r.0",
        item_index=0,
        transfer_digest=hashlib.sha256(whole).digest(),
        chunk_index=0,
        chunk_count=1,
        total_bytes=len(whole),
        payload=whole,
    )
    decoded_map = unpackb(to_msgpack(chunk))
    assert decoded_map["kind"] == RESULT_CHUNK_KIND
    assert isinstance(decoded_map["transfer_digest"], bytes)
    assert len(decoded_map["transfer_digest"]) == 32
    assert is_result_chunk(decoded_map)
    rebuilt = from_msgpack(structure(decoded_map, ResultChunkV1).payload, WorkResult)
    assert rebuilt.result_msgpack.packed() == b"x" * 10


def test_work_results_are_not_chunks_even_with_extra_fields():
    # seed 000 §16.2: only the exact kind enters the v1 decoder; a WorkResult with total_bytes stays a result.
    assert not is_result_chunk({"work_item_id": "r.0", "total_bytes": 3})
    assert not is_result_chunk({"kind": "result_chunk_v2"})
