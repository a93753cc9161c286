"""ResultBody: a result body is a value in one process and msgpack bytes across an edge; each form is made
from the other at most once, and only where a reader or writer needs it."""

from __future__ import annotations

import numpy as np
import pytest

from sie.wire import DecodeError, from_msgpack, packb, payload, to_msgpack
from sie.wire.payload import ResultBody
from sie.wire.queue import WorkResult

VALUE = {"dense": {"dims": 3, "dtype": "float32", "values": np.array([0.5, -1.0, 2.0], dtype=np.float32)}}


@pytest.fixture()
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"packb": 0, "unpackb": 0}
    real_pack, real_unpack = payload.packb, payload.unpackb

    def pack(value: object) -> bytes:
        calls["packb"] += 1
        return real_pack(value)

    def unpack(data: bytes) -> object:
        calls["unpackb"] += 1
        return real_unpack(data)

    monkeypatch.setattr(payload, "packb", pack)
    monkeypatch.setattr(payload, "unpackb", unpack)
    return calls


def result(body: ResultBody) -> WorkResult:
    return WorkResult(work_item_id="r.0", request_id="r", item_index=0, success=True, result_msgpack=body)


def test_a_value_is_read_back_as_itself_and_never_packed_unless_it_crosses_an_edge(counted) -> None:
    body = ResultBody.of(VALUE)
    assert body.value is VALUE
    assert counted == {"packb": 0, "unpackb": 0}
    wire = to_msgpack(result(body))  # the NATS / IPC edge
    to_msgpack(result(body))
    assert counted == {"packb": 1, "unpackb": 0}  # packed once, then the bytes are reused
    assert packb(VALUE) in wire


def test_bytes_from_an_edge_are_unpacked_once_and_only_when_read(counted) -> None:
    arrived = from_msgpack(to_msgpack(result(ResultBody.of(VALUE))), WorkResult).result_msgpack
    assert counted == {"packb": 1, "unpackb": 0}
    first, again = arrived.value, arrived.value
    assert np.array_equal(first["dense"]["values"], VALUE["dense"]["values"]) and again is first
    assert counted["unpackb"] == 1
    forwarded = to_msgpack(result(arrived))  # a sidecar passing a worker's bytes on to NATS: no repack
    assert counted["packb"] == 1 and arrived.packed() in forwarded


def test_size_hint_is_exact_once_packed_and_close_before() -> None:
    body = ResultBody.of({"values": np.zeros(1000, dtype=np.float32)})
    estimate = body.size_hint()
    exact = len(body.packed())
    assert abs(estimate - exact) < 0.05 * exact and body.size_hint() == exact


def test_constructors_take_packed_bytes_and_bad_bytes_fail_when_read() -> None:
    assert result(b"\x80").result_msgpack == ResultBody.of({})  # type: ignore[arg-type]
    with pytest.raises(DecodeError):
        _ = ResultBody.from_packed(b"\xc1").value
    with pytest.raises(ValueError, match="needs a value or its packed bytes"):
        ResultBody()
