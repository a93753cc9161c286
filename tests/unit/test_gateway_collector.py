"""Result collection on `_INBOX.{router_id}.>`: slots, duplicates, strays, timeouts, no leaks (seed 000 §8.2, §16.2)."""

from __future__ import annotations

import asyncio

import pytest

from sie.gateway.collector import Collector
from sie.gateway.errors import GatewayTimeoutError, QueueUnavailableError
from sie.transport.loopback import LoopbackTransport
from sie.wire.queue import WorkResult


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
