"""The local-ingest protocol's pure pieces (sie.sidecar.local_protocol, seed 001 "Local Ingest"): the frame header
and its limit, a submit's validation against the lane, the budgets a connection takes from; and the result
publisher sending a local item's result whole, whatever the broker's limit."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from sie.sidecar.local_protocol import (
    HEADER,
    Addressing,
    Budget,
    ProtocolError,
    SubmitRefused,
    encode_frame,
    error_frame,
    frame_length,
    hello_frame,
    read_submit,
    result_frame,
    submit_items,
)
from sie.sidecar.publishing import ResultPublisher
from sie.transport.base import Lane
from sie.wire import codes, packb, unpackb, unstructure
from sie.wire.payload import ResultBody
from sie.wire.queue import WorkItem, WorkResult

LANE = Lane("default", "l4", "default")
ADDRESSING = Addressing("sie-local-ab12", "_INBOX.sie-local-ab12.1.7")


def raw_item(**fields: Any) -> dict[str, Any]:
    item = {"work_item_id": "r.0", "request_id": "r", "item_index": 0, "total_items": 1, "operation": "encode",
            "model_id": "org/model", "profile_id": "default", "timestamp": 1.0, "item": {"text": "hi"}}  # fmt: skip
    item.update(fields)
    return item


def submit_body(items: Any, submit_id: Any = "s1", kind: str = "submit") -> bytes:
    return packb({"type": kind, "id": submit_id, "items": items})


def body_of(frame: bytes) -> Any:
    (length,) = HEADER.unpack(frame[: HEADER.size])
    assert length == len(frame) - HEADER.size
    return unpackb(frame[HEADER.size :])


def test_a_header_declares_its_length_and_one_over_the_limit_is_refused_unread() -> None:
    assert frame_length(HEADER.pack(1024), 1024) == 1024
    assert frame_length(HEADER.pack(0), 1024) == 0
    with pytest.raises(ProtocolError) as caught:
        frame_length(HEADER.pack(1025), 1024)
    assert caught.value.code == codes.PAYLOAD_TOO_LARGE
    assert "1025" in caught.value.message


def test_server_frames_carry_their_type() -> None:
    hello = body_of(hello_frame(LANE, "w-1", 4096, 8))
    assert hello == {"type": "hello", "version": 1, "pool": "default", "machine_profile": "l4", "bundle": "default",
                     "worker_id": "w-1", "max_frame_bytes": 4096, "max_inflight_items": 8}  # fmt: skip
    assert body_of(error_frame("s1", codes.QUEUE_FULL, "busy")) == {
        "type": "error", "id": "s1", "code": "QUEUE_FULL", "message": "busy"
    }  # fmt: skip
    result = WorkResult(work_item_id="r.0", request_id="r", item_index=0, success=True,
                        result_msgpack=ResultBody.of({"dense": {"values": np.ones(3, np.float32)}}))  # fmt: skip
    frame = body_of(result_frame("s1", 2, result))
    assert (frame["type"], frame["id"], frame["index"]) == ("result", "s1", 2)
    assert frame["result"] == unstructure(result)
    assert body_of(encode_frame({"type": "x"})) == {"type": "x"}


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"\xc1", "malformed"),
        (packb([1, 2]), "must be a map"),
        (submit_body([], kind="cancel"), "unknown frame type"),
        (submit_body([], submit_id=""), "id must be"),
        (submit_body([], submit_id=7), "id must be"),
        (submit_body([], submit_id="x" * 257), "id must be"),
    ],
)
def test_a_frame_that_is_no_submit_breaks_the_protocol(body: bytes, fragment: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        read_submit(body)
    assert caught.value.code == codes.INVALID_INPUT
    assert fragment in caught.value.message


def test_the_server_addresses_items_and_fills_the_lane() -> None:
    items = submit_items(read_submit(submit_body([raw_item(), raw_item(work_item_id="r.1", item_index=1,
                                                                      pool_name="default", machine_profile="l4")])),
                         LANE, 8, ADDRESSING)  # fmt: skip
    assert [item.reply_subject for item in items] == ["_INBOX.sie-local-ab12.1.7.0", "_INBOX.sie-local-ab12.1.7.1"]
    assert {(item.pool_name, item.machine_profile, item.router_id) for item in items} == {
        ("default", "l4", "sie-local-ab12")
    }
    assert all(isinstance(item, WorkItem) for item in items)


def test_a_client_cannot_aim_results_elsewhere() -> None:
    [item] = submit_items(read_submit(submit_body([raw_item(reply_subject="_INBOX.gw.req", router_id="gw")])),
                          LANE, 8, ADDRESSING)  # fmt: skip
    assert (item.reply_subject, item.router_id) == ("_INBOX.sie-local-ab12.1.7.0", "sie-local-ab12")


@pytest.mark.parametrize(
    ("items", "fragment"),
    [
        ([], "non-empty list"),
        ({"a": 1}, "non-empty list"),
        ([raw_item()] * 9, "more than the 8"),
        (["text"], "must be a map"),
        ([raw_item(pool_name="elsewhere")], "pool_name 'elsewhere'"),
        ([raw_item(machine_profile="h100")], "machine_profile 'h100'"),
        ([raw_item(model_id="")], "no model_id"),
        ([raw_item(operation="generate")], "generation is not served"),
        ([raw_item(payload_ref="r_0.bin")], "payload_ref"),
        ([raw_item(item_index="zero")], "not a work item"),
        ([raw_item(), raw_item(item_index=1)], "repeats"),
    ],
)
def test_a_submit_the_lane_will_not_run_is_refused_under_its_id(items: Any, fragment: str) -> None:
    with pytest.raises(SubmitRefused) as caught:
        submit_items(read_submit(submit_body(items)), LANE, 8, ADDRESSING)
    assert (caught.value.submit_id, caught.value.code) == ("s1", codes.INVALID_INPUT)
    assert fragment in caught.value.message


async def test_a_budget_refuses_or_waits_for_what_does_not_fit() -> None:
    budget = Budget(10)
    assert budget.try_take(6)
    assert not budget.try_take(5)
    assert budget.try_take(4)
    waiter = asyncio.get_running_loop().create_task(budget.take(3))
    await asyncio.sleep(0)
    assert not waiter.done()  # reading stops while the budget is out
    budget.give(2)
    await asyncio.sleep(0)
    assert not waiter.done()
    budget.give(1)
    await asyncio.wait_for(waiter, 1.0)
    assert budget.used == 10
    with pytest.raises(ValueError, match="over the budget's limit"):
        await budget.take(11)
    budget.give(100)
    assert budget.used == 0


class Bus:
    """Records each published result; refuses, as NATS does, a message over `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.published: list[tuple[str, Any]] = []

    @property
    def max_payload(self) -> int:
        return self.limit

    async def publish_result(self, subject: str, message: Any) -> None:
        self.published.append((subject, message))


async def test_a_local_result_goes_whole_past_the_broker_limit() -> None:
    bus = Bus(limit=1024)
    publisher = ResultPublisher(bus, lambda: bus.limit, unbounded=lambda subject: subject.startswith("_INBOX.local."))
    big = WorkResult(work_item_id="r.0", request_id="r", item_index=0, success=True,
                     result_msgpack=ResultBody.of({"values": np.zeros(4096, np.float32)}))  # fmt: skip
    local = WorkItem(**{**raw_item(), "pool_name": "p", "machine_profile": "m", "router_id": "local",
                        "reply_subject": "_INBOX.local.1.1.0"})  # fmt: skip
    await publisher.publish(local, big)
    assert bus.published == [("_INBOX.local.1.1.0", big)]
    broker = WorkItem(**{**raw_item(), "pool_name": "p", "machine_profile": "m", "router_id": "gw",
                         "reply_subject": "_INBOX.gw.r"})  # fmt: skip
    await publisher.publish(broker, big)
    assert bus.published[1][1].error_code == codes.PAYLOAD_TOO_LARGE
