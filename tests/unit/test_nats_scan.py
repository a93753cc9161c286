"""peek_request_id: the request id read from raw WorkResult bytes, or None (decode to know), never a wrong id."""

from __future__ import annotations

import ormsgpack
import pytest

from sie.transport.nats import peek_request_id
from sie.transport.nats.scan import SCAN_LIMIT
from sie.wire import to_msgpack
from sie.wire.queue import WorkResult


def _result(request_id: str, work_item_id: str | None = None, **fields: object) -> bytes:
    work_item_id = f"{request_id}.0" if work_item_id is None else work_item_id
    result = WorkResult(work_item_id=work_item_id, request_id=request_id, item_index=0, success=True, **fields)
    return to_msgpack(result)


@pytest.mark.parametrize(
    "request_id",
    [
        "",
        "abc-123",
        "x" * 31,  # the longest fixstr
        "y" * 32,  # str 8
        "z" * 300,  # str 16
        "é-ünïcode-请求",
    ],
)
def test_reads_the_request_id_of_a_work_result(request_id: str) -> None:
    assert peek_request_id(_result(request_id)) == request_id


def test_a_large_result_payload_does_not_matter() -> None:
    data = _result("req-1", result_msgpack=b"\xaarequest_id\xa3bad" * 10_000, error="x" * 70_000)
    assert peek_request_id(data) == "req-1"


def test_a_look_alike_inside_the_work_item_id_is_not_taken() -> None:
    # The canonical layout is walked exactly, so key bytes inside the first value are never the answer.
    assert peek_request_id(_result("real", work_item_id="ª" + "request_id" + "\xa4fake")) == "real"


def test_another_key_order_falls_back_to_the_scan() -> None:
    data = ormsgpack.packb({"item_index": 0, "request_id": "req-9", "work_item_id": "req-9.0", "success": True})
    assert peek_request_id(data) == "req-9"


def test_a_map32_header_is_walked_too() -> None:
    data = b"\xdf\x00\x00\x00\x02" + b"\xacwork_item_id\xa3w.0" + b"\xaarequest_id\xa1w"
    assert peek_request_id(data) == "w"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x90",  # an empty array
        ormsgpack.packb({"work_item_id": "a.0", "success": True}),  # no request_id at all
        ormsgpack.packb({"request_id": 7}),  # not a str
        _result("truncated")[:42],  # cut inside the id
        b"\x82\xaarequest_id\xa3\xff\xfe\xfd",  # not UTF-8
        b"\x81\xaarequest_id\xda\x00",  # str 16 header cut short
        b"\x00" * SCAN_LIMIT + ormsgpack.packb({"request_id": "far"}),  # beyond the scan
    ],
)
def test_none_when_the_id_cannot_be_read_cheaply(data: bytes) -> None:
    assert peek_request_id(data) is None
