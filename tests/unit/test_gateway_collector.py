"""Result collection on `_INBOX.{router_id}.>`: slots, duplicates, strays, timeouts, no leaks (seed 000 §8.2, §16.2)."""

from __future__ import annotations

import asyncio

import attrs
import numpy as np
import pytest

from sie.gateway.collector import Collector
from sie.gateway.errors import GatewayTimeoutError, QueueUnavailableError, TransportFailureError
from sie.transport.loopback import LoopbackTransport
from sie.wire import to_msgpack
from sie.wire.payload import ResultBody
from sie.wire.queue import ResultChunkV1, WorkResult
from sie.wire.result_chunks import chunk_bytes_for, split, transfer_digest


def result(request_id: str, index: int, **fields: object) -> WorkResult:
    return WorkResult(work_item_id=f"{request_id}.{index}", request_id=request_id, item_index=index, success=True,
                      **fields)  # fmt: skip


async def test_request_completes_when_every_slot_is_filled() -> None:
    async with LoopbackTransport() as transport, Collector(transport, "gw") as collector:
        with collector.expect("gw-1", 2) as pending:
            await transport.publish_result("_INBOX.gw.gw-1", result("gw-1", 1, inference_ms=2.0))
            assert pending.missing == 1
            await transport.publish_result("_INBOX.gw.gw-1", result("gw-1", 0))
            results = await pending.wait(1.0)
            assert [r.item_index for r in results] == [0, 1]
            assert len(collector) == 1
        assert len(collector) == 0


async def test_duplicates_strays_and_out_of_range_slots_are_dropped() -> None:
    async with LoopbackTransport() as transport, Collector(transport, "gw") as collector:
        with collector.expect("gw-1", 1) as pending:
            await transport.publish_result("_INBOX.gw.gw-9", result("gw-9", 0))
            await transport.publish_result("_INBOX.gw.gw-1", result("gw-1", 5))
            await transport.publish_result("_INBOX.other.gw-1", result("gw-1", 0, worker_id="elsewhere"))
            assert pending.missing == 1
            await transport.publish_result("_INBOX.gw.gw-1", result("gw-1", 0, worker_id="first"))
            await transport.publish_result("_INBOX.gw.gw-1", result("gw-1", 0, worker_id="redelivered"))
            (only,) = await pending.wait(1.0)
            assert only.worker_id == "first"


async def test_timeout_is_a_gateway_timeout_and_removes_the_entry() -> None:
    async with LoopbackTransport() as transport, Collector(transport, "gw") as collector:
        with pytest.raises(GatewayTimeoutError, match="0 of 2 items"), collector.expect("gw-1", 2) as pending:
            await pending.wait(0.01)
        assert len(collector) == 0


async def test_cancelled_wait_removes_the_entry() -> None:
    async with LoopbackTransport() as transport, Collector(transport, "gw") as collector:

        async def waiter() -> None:
            with collector.expect("gw-1", 1) as pending:
                await pending.wait(10.0)

        task = asyncio.ensure_future(waiter())
        await asyncio.sleep(0)
        assert len(collector) == 1
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert len(collector) == 0


async def test_stopping_the_collector_fails_waiting_requests() -> None:
    async with LoopbackTransport() as transport:
        collector = Collector(transport, "gw")
        async with collector:
            expectation = collector.expect("gw-1", 1)
            pending = expectation.__enter__()
        with pytest.raises(QueueUnavailableError):
            await pending.wait(1.0)
        expectation.__exit__(None, None, None)
        with pytest.raises(QueueUnavailableError, match="not running"), collector.expect("gw-2", 1):
            pass


# --- worker direct-dispatch fallback (seed 000 §8.2) -----------------------------------------------------


async def test_a_late_direct_origin_result_for_an_item_that_fell_back_is_ignored() -> None:
    async with LoopbackTransport() as transport, Collector(transport, "gw") as collector:
        with collector.expect("gw-1", 3) as pending:
            await transport.publish_result(
                "_INBOX.gw.gw-1", result("gw-1", 0, worker_id="w-direct", direct_origin=True)
            )
            assert pending.unanswered() == [1, 2]  # a direct answer before any fallback counts
            pending.fall_back([1, 2])  # the lane stored items 1 and 2
            await transport.publish_result(
                "_INBOX.gw.gw-1", result("gw-1", 1, worker_id="w-direct", direct_origin=True)
            )
            assert pending.missing == 2 and pending.unanswered() == [1, 2]
            await transport.publish_result("_INBOX.gw.gw-1", result("gw-1", 1, worker_id="w-lane"))
            await transport.publish_result("_INBOX.gw.gw-1", result("gw-1", 2, worker_id="w-lane", direct_origin=False))
            results = await pending.wait(1.0)
            assert [r.worker_id for r in results] == ["w-direct", "w-lane", "w-lane"]
            assert pending.unanswered() == []


async def test_unanswered_is_empty_once_nobody_waits() -> None:
    async with LoopbackTransport() as transport, Collector(transport, "gw") as collector:
        with collector.expect("gw-1", 2) as pending:
            assert pending.unanswered() == [0, 1]
            pending.fail(QueueUnavailableError("gone"))
            assert pending.unanswered() == []
            with pytest.raises(QueueUnavailableError):
                await pending.wait(1.0)


# --- result_chunk_v1 (seed 000 §16.2) -------------------------------------------------------------------


def chunked(request_id: str, index: int, limit: int = 2048, **fields: object) -> list[ResultChunkV1]:
    """A result too large for a `limit`-byte broker message, cut into chunks that fit."""
    body = ResultBody.of({"dense": {"values": np.arange(2000, dtype=np.float32)}})
    whole = result(request_id, index, result_msgpack=body, **fields)
    payload = to_msgpack(whole)
    return split(whole, payload, transfer_digest(payload), chunk_bytes_for(whole, limit))


async def test_chunked_results_fill_their_slot_once_reassembled_and_release_their_reservation() -> None:
    async with LoopbackTransport() as transport, Collector(transport, "gw") as collector:
        with collector.expect("gw-1", 2) as pending:
            await transport.publish_result("_INBOX.gw.gw-1", result("gw-1", 0))
            chunks = chunked("gw-1", 1)
            for chunk in reversed(chunks):
                await transport.publish_result("_INBOX.gw.gw-1", chunk)
            results = await pending.wait(1.0)
            assert np.array_equal(results[1].result_msgpack.value["dense"]["values"], np.arange(2000))
            assert collector.chunk_budget.reserved_bytes > 0  # held until the request ends
        assert collector.chunk_budget.reserved_bytes == 0


async def test_a_late_chunked_direct_result_for_an_item_that_fell_back_leaves_room_for_the_lanes() -> None:
    async with LoopbackTransport() as transport, Collector(transport, "gw") as collector:
        with collector.expect("gw-1", 1) as pending:
            pending.fall_back([0])
            for chunk in chunked("gw-1", 0, worker_id="w-direct", direct_origin=True):
                await transport.publish_result("_INBOX.gw.gw-1", chunk)
            assert pending.missing == 1
            for chunk in chunked("gw-1", 0, worker_id="w-lane"):
                await transport.publish_result("_INBOX.gw.gw-1", chunk)
            (answer,) = await pending.wait(1.0)
            assert answer.worker_id == "w-lane"


async def test_an_invalid_transfer_fails_the_request_at_once_with_a_static_transport_failure() -> None:
    async with LoopbackTransport() as transport, Collector(transport, "gw") as collector:
        with collector.expect("gw-1", 1) as pending:
            first, second, *_ = chunked("gw-1", 0)
            await transport.publish_result("_INBOX.gw.gw-1", first)
            forged = attrs.evolve(second, payload=b"x" * len(second.payload))
            await transport.publish_result("_INBOX.gw.gw-1", second)
            await transport.publish_result("_INBOX.gw.gw-1", forged)
            with pytest.raises(TransportFailureError) as caught:
                await pending.wait(10.0)
            assert caught.value.code == "transport_failure" and "gw-1" not in caught.value.message
        assert collector.chunk_budget.reserved_bytes == 0


async def test_chunks_for_answered_or_unknown_requests_reserve_nothing() -> None:
    async with LoopbackTransport() as transport, Collector(transport, "gw") as collector:
        with collector.expect("gw-1", 1) as pending:
            await transport.publish_result("_INBOX.gw.gw-1", result("gw-1", 0))
            for chunk in chunked("gw-1", 0) + chunked("gw-9", 0):
                await transport.publish_result("_INBOX.gw.gw-1", chunk)
            await pending.wait(1.0)
            assert collector.chunk_budget.reserved_bytes == 0


async def test_close_hooks_run_once_whatever_the_outcome() -> None:
    calls: list[str] = []
    async with LoopbackTransport() as transport, Collector(transport, "gw") as collector:
        with pytest.raises(GatewayTimeoutError), collector.expect("gw-1", 1) as pending:
            pending.at_close(lambda: calls.append("gw-1"))
            await pending.wait(0.01)
        with collector.expect("gw-2", 1) as pending:
            pending.at_close(lambda: calls.append("gw-2"))
            await transport.publish_result("_INBOX.gw.gw-2", result("gw-2", 0))
            await pending.wait(1.0)
    assert calls == ["gw-1", "gw-2"]
