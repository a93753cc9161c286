"""Throughput of the NATS transport on a real server, printed (`pytest -s`) for the record, not asserted beyond
completeness: publish_work awaited one by one and overlapped, against nats-py's publish_async with one drain of
the ACKs; publish_work -> fetch -> ack cycles; result publish -> receive. Gateway and sidecar share one process
and event loop here, so the numbers are a floor for separate processes."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

from launcher import NatsServer
from sie.catalog.names import reply_subject, work_subject
from sie.settings import StreamSettings
from sie.settings.messaging import NatsSettings
from sie.transport.base import Delivery, Lane
from sie.transport.nats import NatsTransport
from sie.wire import to_msgpack
from sie.wire.queue import WorkItem, WorkResult

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
BURST = 64  # items a request publishes together


def _lane() -> Lane:
    return Lane(pool=f"b{uuid.uuid4().hex[:10]}", machine_profile="cpu", bundle="default")


def _item(lane: Lane, index: int) -> WorkItem:
    return WorkItem(
        work_item_id=f"req-{index}.0", request_id=f"req-{index}", item_index=0, total_items=1, operation="encode",
        model_id=MODEL, profile_id="default", pool_name=lane.pool, machine_profile=lane.machine_profile,
        router_id="gw-1", reply_subject=reply_subject("gw-1", f"req-{index}"), timestamp=time.time(),
        item={"text": "a single sentence of about the usual benchmark length"},
    )  # fmt: skip


def _transport(server: NatsServer) -> NatsTransport:
    # max_msgs well above what one measurement queues; ack_wait long enough that nothing is redelivered.
    return NatsTransport(NatsSettings(url=server.url), StreamSettings(max_msgs=1_000_000, ack_wait_s=60.0))


async def _timed(count: int, run: Callable[[], Awaitable[None]]) -> float:
    started = time.perf_counter()
    await run()
    return count / (time.perf_counter() - started)


async def _publish_bursts(transport: NatsTransport, lane: Lane, items: list[WorkItem]) -> None:
    subject = work_subject(lane.pool, lane.machine_profile, lane.bundle, MODEL)
    for start in range(0, len(items), BURST):
        await asyncio.gather(*(transport.publish_work(subject, item) for item in items[start : start + BURST]))


async def _consume(transport: NatsTransport, lane: Lane, count: int) -> None:
    consumer = await transport.consumer(lane)
    taken = 0
    while taken < count:
        deliveries: list[Delivery] = await consumer.fetch(BURST, 5.0)
        assert deliveries, f"fetch timed out after {taken} of {count}"
        for delivery in deliveries:
            await delivery.ack()
        taken += len(deliveries)


async def test_publish_fetch_and_result_throughput(nats_server: NatsServer) -> None:
    rates: dict[str, float] = {}
    async with _transport(nats_server) as gateway, _transport(nats_server) as sidecar:
        lane = _lane()
        subject = work_subject(lane.pool, lane.machine_profile, lane.bundle, MODEL)
        await gateway.publish_work(subject, _item(lane, -1))  # the stream exists before anything is timed

        one_by_one = [_item(lane, index) for index in range(1000)]
        rates["publish_work, awaited one by one"] = await _timed(
            1000, lambda: _sequential(gateway, subject, one_by_one)
        )
        overlapped = [_item(lane, index) for index in range(5000)]
        rates[f"publish_work, {BURST} overlapped"] = await _timed(
            5000, lambda: _publish_bursts(gateway, lane, overlapped)
        )
        submitted = [_item(lane, index) for index in range(5000)]
        rates[f"submit_work, {BURST} then one ACK drain"] = await _timed(
            5000, lambda: _submit_bursts(gateway, subject, submitted)
        )
        payloads = [to_msgpack(_item(lane, index)) for index in range(5000)]
        rates["(nats-py publish_async, one ACK drain)"] = await _timed(
            5000, lambda: _publish_async_drained(gateway, subject, payloads)
        )
        queued = 1 + 1000 + 3 * 5000
        assert await _settled_depth(gateway, lane.pool) == queued
        rates["fetch(64) + ack, backlog"] = await _timed(queued, lambda: _consume(sidecar, lane, queued))

        lane = _lane()
        items = [_item(lane, index) for index in range(5000)]
        await sidecar.consumer(lane)
        rates["publish -> fetch -> ack, pipelined"] = await _timed(
            5000, lambda: _both(_publish_bursts(gateway, lane, items), _consume(sidecar, lane, 5000))
        )
        rates["publish -> fetch -> ack, one at a time"] = await _timed(300, lambda: _round_trips(gateway, sidecar))
        rates["result publish -> receive"] = await _timed(20_000, lambda: _results(gateway, sidecar, None))
        rates["result, half dropped by the id scan"] = await _timed(20_000, lambda: _results(gateway, sidecar, 2))

    width = max(map(len, rates))
    print("\nNATS transport throughput (one process, nats-server 2.15.1):")
    for name, rate in rates.items():
        print(f"  {name:<{width}}  {rate:>9,.0f} /s")


async def _sequential(transport: NatsTransport, subject: str, items: list[WorkItem]) -> None:
    for item in items:
        await transport.publish_work(subject, item)


async def _submit_bursts(transport: NatsTransport, subject: str, items: list[WorkItem]) -> None:
    for start in range(0, len(items), BURST):
        await (await transport.submit_work_batch(subject, items[start : start + BURST]))


async def _publish_async_drained(transport: NatsTransport, subject: str, payloads: list[bytes]) -> None:
    # The alternative publish_work could be: submit everything, then one task awaits every ACK (6 s cap).
    js = transport._open("bench").connection.js
    acks = [await js.publish_async(subject, payload) for payload in payloads]
    await asyncio.wait_for(asyncio.gather(*acks), 6.0)


async def _settled_depth(transport: NatsTransport, pool: str) -> int:
    await asyncio.sleep(0.06)  # past the pending cache
    return await transport.pending(pool)


async def _both(first: Awaitable[None], second: Awaitable[None]) -> None:
    await asyncio.gather(first, second)


async def _round_trips(gateway: NatsTransport, sidecar: NatsTransport) -> None:
    lane = _lane()
    consumer = await sidecar.consumer(lane)
    subject = work_subject(lane.pool, lane.machine_profile, lane.bundle, MODEL)
    for index in range(300):
        await gateway.publish_work(subject, _item(lane, index))
        (delivery,) = await consumer.fetch(1, 5.0)
        await delivery.ack()


async def _results(gateway: NatsTransport, sidecar: NatsTransport, drop_every: int | None) -> None:
    router = f"gw-{uuid.uuid4().hex[:8]}"
    done = asyncio.get_running_loop().create_future()
    expected = 20_000 if drop_every is None else 20_000 - 20_000 // drop_every
    received = 0

    def on_result(result: WorkResult) -> None:
        nonlocal received
        received += 1
        if received == expected and not done.done():
            done.set_result(None)

    wants = None if drop_every is None else (lambda request_id: int(request_id) % drop_every != 0)
    await gateway.subscribe_results(f"_INBOX.{router}.>", on_result, wants=wants)
    await gateway.flush()
    for index in range(20_000):
        result = WorkResult(work_item_id=f"{index}.0", request_id=str(index), item_index=0, success=True,
                            result_msgpack=b"\x00" * 1536)  # fmt: skip
        await sidecar.publish_result(reply_subject(router, str(index)), result)
    await sidecar.flush()
    await asyncio.wait_for(done, 10.0)
