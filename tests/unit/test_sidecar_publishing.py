"""How the sidecar sends a result within the broker's message limit (sie.sidecar.publishing, seed 001 "Preparation And
Framing"): whole when it fits, result_chunk_v1 envelopes when the gateway accepts them, otherwise the compact
PAYLOAD_TOO_LARGE answer; through the settler, every envelope is published and flushed once before the ACK."""

from __future__ import annotations

import numpy as np
import pytest

from sie.gateway.result_chunks import ChunkBudget, ResultReassembly
from sie.sidecar.admission import Admission
from sie.sidecar.publishing import ResultPublisher
from sie.sidecar.settlement import Settler
from sie.sidecar.work import Work
from sie.wire import codes, to_msgpack
from sie.wire.payload import ResultBody
from sie.wire.queue import RESULT_CHUNK_MAX_TOTAL_BYTES, ResultChunkV1, WorkItem, WorkResult
from support.sidecar_fakes import RecordingDelivery

LIMIT = 64 * 1024


class Bus:
    """Records what is published and flushed; refuses, as NATS does, a message over `limit`."""

    def __init__(self, limit: int | None = LIMIT, log: list | None = None) -> None:
        self.limit = limit
        self.log = log if log is not None else []
        self.messages: list[WorkResult | ResultChunkV1] = []

    @property
    def max_payload(self) -> int | None:
        return self.limit

    async def publish_result(self, subject: str, message: WorkResult | ResultChunkV1) -> None:
        if self.limit is not None and len(to_msgpack(message)) > self.limit:
            raise AssertionError(f"a {len(to_msgpack(message))}-byte message is over the broker's limit")
        self.messages.append(message)
        self.log.append(("publish", type(message).__name__))

    async def flush(self) -> None:
        self.log.append(("flush",))


def work_item(accepts_chunks: bool = True) -> WorkItem:
    return WorkItem(
        work_item_id="gw-1-4.0", request_id="gw-1-4", item_index=0, total_items=1, operation="encode", model_id="m",
        profile_id="default", pool_name="default", machine_profile="default", router_id="gw-1",
        reply_subject="_INBOX.gw-1.gw-1-4", timestamp=0.0, accepts_result_chunks=accepts_chunks,
    )  # fmt: skip


def result_of(nbytes: int, *, packed: bool = True) -> WorkResult:
    """A successful multivector result with about `nbytes` of vectors, its body packed as it arrives over IPC."""
    values = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
    body = ResultBody.of({"multivector": {"dims": 4, "dtype": "float32", "values": values.reshape(-1, 4)}})
    if packed:
        body = ResultBody.from_packed(body.packed())
    return WorkResult(work_item_id="gw-1-4.0", request_id="gw-1-4", item_index=0, success=True, result_msgpack=body,
                      worker_id="w-1", inference_ms=12.0, executed_bundle_config_hash="abc")  # fmt: skip


# 40,000 bytes: estimated over half the limit, so measured exactly, and it fits.
@pytest.mark.parametrize(("limit", "size"), [(None, 4 << 20), (LIMIT, 20_000), (LIMIT, 40_000)])
async def test_a_result_that_fits_goes_whole(limit: int | None, size: int) -> None:
    bus = Bus(limit)
    result = result_of(size, packed=limit is not None)
    await ResultPublisher(bus, lambda: bus.max_payload).publish(work_item(), result)
    assert bus.messages == [result]


async def test_a_large_result_goes_as_chunks_that_each_fit_and_rebuild_the_result() -> None:
    bus = Bus()
    result = result_of(500_000)
    publisher = ResultPublisher(bus, lambda: bus.max_payload)
    await publisher.publish(work_item(), result)
    assert len(bus.messages) == 8 and all(isinstance(m, ResultChunkV1) for m in bus.messages)
    reassembly = ResultReassembly("gw-1-4", 1, ChunkBudget())
    rebuilt = [reassembly.add(chunk) for chunk in bus.messages]  # type: ignore[arg-type]
    assert rebuilt[:-1] == [None] * 7 and to_msgpack(rebuilt[-1]) == to_msgpack(result)
    assert publisher.chunked == 1 and publisher.too_large == 0


async def test_a_gateway_that_does_not_accept_chunks_gets_a_compact_payload_too_large() -> None:
    bus = Bus()
    publisher = ResultPublisher(bus, lambda: bus.max_payload)
    await publisher.publish(work_item(accepts_chunks=False), result_of(500_000))
    (answer,) = bus.messages
    assert isinstance(answer, WorkResult) and not answer.success
    assert answer.error_code == codes.PAYLOAD_TOO_LARGE and answer.result_msgpack is None
    assert str(LIMIT) in answer.error and answer.inference_ms == 12.0 and answer.worker_id == "w-1"
    assert answer.executed_bundle_config_hash is None
    assert publisher.too_large == 1


@pytest.mark.parametrize(
    ("limit", "size"),
    [(1 << 20, RESULT_CHUNK_MAX_TOTAL_BYTES + 1024), (8 * 1024, 600_000), (300, 10_000)],
    ids=["over 16 MiB", "over 64 chunks", "no envelope fits"],
)
async def test_a_transfer_past_the_v1_bounds_is_answered_payload_too_large(limit: int, size: int) -> None:
    bus = Bus(limit)
    await ResultPublisher(bus, lambda: bus.max_payload).publish(work_item(), result_of(size))
    (answer,) = bus.messages
    assert isinstance(answer, WorkResult) and answer.error_code == codes.PAYLOAD_TOO_LARGE


async def test_the_settler_publishes_every_chunk_then_flushes_once_then_acks() -> None:
    log: list = []
    bus = Bus(log=log)
    admission = Admission(10)
    work = Work(RecordingDelivery(work_item(), log, "sie.work.default.default.default.m"), 0.0)
    admission.admit("m", [work])
    settler = Settler(bus, admission, results=ResultPublisher(bus, lambda: bus.max_payload))
    await settler.reply([(work, result_of(300_000))])
    assert log == [("publish", "ResultChunkV1")] * 5 + [("flush",), ("ack", "gw-1-4.0")]
    assert admission.total == 0


async def test_a_settler_without_a_limit_publishes_results_as_they_are() -> None:
    log: list = []
    bus = Bus(limit=None, log=log)
    admission = Admission(10)
    work = Work(RecordingDelivery(work_item(), log, "sie.work.default.default.default.m"), 0.0)
    admission.admit("m", [work])
    result = result_of(2 << 20, packed=False)
    await Settler(bus, admission).reply([(work, result)])
    assert bus.messages == [result] and log[-1] == ("ack", "gw-1-4.0")
