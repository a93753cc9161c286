"""What only a real broker shows about the NATS lane consumer and connection: malformed payloads are NAKed and
never returned, unsettled work outlives the process that fetched it, and a lost broker is TransportUnavailable."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from launcher import NatsServer
from sie.catalog.names import MAX_DELIVERIES_ADVISORY, work_subject
from sie.settings import StreamSettings
from sie.settings.messaging import NatsSettings
from sie.transport.base import Lane, MaxDeliveriesAdvisory, TransportUnavailable
from sie.transport.nats import NatsTransport
from sie.wire.queue import WorkItem
from support.polling import eventually

MODEL = "BAAI/bge-m3"
LONG_WAIT_S = 5.0


@pytest.fixture
def lane() -> Lane:
    return Lane(pool=f"c{uuid.uuid4().hex[:12]}", machine_profile="l4", bundle="default")


def _transport(url: str, **settings: Any) -> NatsTransport:
    return NatsTransport(NatsSettings(url=url), StreamSettings(**settings))


def _item(lane: Lane, index: int = 0) -> WorkItem:
    return WorkItem(
        work_item_id=f"r{index}.0", request_id=f"r{index}", item_index=0, total_items=1, operation="encode",
        model_id=MODEL, profile_id="default", pool_name=lane.pool, machine_profile=lane.machine_profile,
        router_id="gw-1", reply_subject=f"_INBOX.gw-1.r{index}", timestamp=time.time(), item={"text": "hi"},
    )  # fmt: skip


def _subject(lane: Lane) -> str:
    return work_subject(lane.pool, lane.machine_profile, lane.bundle, MODEL)


async def test_a_malformed_payload_is_naked_never_returned_and_dead_lettered(
    nats_server: NatsServer, nats_client: Client, lane: Lane
) -> None:
    advisories: list[MaxDeliveriesAdvisory] = []
    async with _transport(nats_server.url, max_deliver=3, ack_wait_s=5.0) as transport:
        await transport.subscribe(
            MAX_DELIVERIES_ADVISORY, lambda subject, message: advisories.append(message), MaxDeliveriesAdvisory
        )
        consumer = await transport.consumer(lane)
        await nats_client.jetstream().publish(_subject(lane), b"\xc1 not msgpack")
        good = _item(lane)
        await transport.publish_work(_subject(lane), good)
        deliveries = await consumer.fetch(10, LONG_WAIT_S)
        assert [delivery.item for delivery in deliveries] == [good]
        await deliveries[0].ack()

        # Fetching goes on NAKing it (redelivered at once); after the third delivery JetStream advises it.
        async def advised() -> bool:
            if advisories:
                return True
            assert await consumer.fetch(10, 0.1) == []
            return False

        await eventually(advised, timeout_s=LONG_WAIT_S, interval_s=0, what="the max-deliveries advisory")
        letter = await transport.dead_letters().capture(advisories[0])
        await eventually(lambda: _pending_is(transport, lane.pool, 0), timeout_s=LONG_WAIT_S)
    assert advisories[0].deliveries == 3
    assert letter is not None
    assert (letter.subject, letter.item, letter.deliveries) == (_subject(lane), None, 3)


async def test_fetch_with_no_timeout_returns_what_is_there_at_once(nats_server: NatsServer, lane: Lane) -> None:
    async with _transport(nats_server.url) as transport:
        consumer = await transport.consumer(lane)
        started = time.monotonic()
        assert await consumer.fetch(5, 0) == []
        items = [_item(lane, index) for index in range(3)]
        for item in items:
            await transport.publish_work(_subject(lane), item)
        deliveries = await consumer.fetch(5, 0)
        assert deliveries  # a fetch returns with the first delivery: the others may still be on their way
        while len(deliveries) < len(items) and time.monotonic() - started < 1.0:
            deliveries += await consumer.fetch(5, 0)
        assert time.monotonic() - started < 1.0
        assert [delivery.item for delivery in deliveries] == items


async def test_unsettled_work_is_redelivered_to_another_process(nats_server: NatsServer, lane: Lane) -> None:
    async with _transport(nats_server.url, ack_wait_s=0.5) as first:
        await first.publish_work(_subject(lane), _item(lane))
        taken = await (await first.consumer(lane)).fetch(1, LONG_WAIT_S)
        assert [delivery.num_delivered for delivery in taken] == [1]
    async with _transport(nats_server.url, ack_wait_s=0.5) as second:
        again = await (await second.consumer(lane)).fetch(1, LONG_WAIT_S)
        assert [delivery.num_delivered for delivery in again] == [2]
        await again[0].ack()


async def test_a_fetch_waiting_when_the_transport_closes_raises_unavailable(
    nats_server: NatsServer, lane: Lane
) -> None:
    async with _transport(nats_server.url) as transport:
        consumer = await transport.consumer(lane)
        waiting = asyncio.ensure_future(consumer.fetch(1, LONG_WAIT_S))
        await asyncio.sleep(0.05)
    with pytest.raises(TransportUnavailable):
        await asyncio.wait_for(waiting, 1.0)


async def test_a_consumer_deleted_behind_our_back_is_created_again(
    nats_server: NatsServer, nats_client: Client, lane: Lane
) -> None:
    async with _transport(nats_server.url) as transport:
        consumer = await transport.consumer(lane)
        waiting = asyncio.ensure_future(consumer.fetch(1, LONG_WAIT_S))  # its pull request is refused: 409
        await asyncio.sleep(0.05)
        await nats_client.jsm().delete_consumer(f"WORK_POOL_{lane.pool}", f"{lane.pool}_l4_default")
        first = _item(lane, 1)
        await transport.publish_work(_subject(lane), first)
        deliveries = await waiting
        assert [delivery.item for delivery in deliveries] == [first]
        await deliveries[0].ack()
        await transport.flush()
        await nats_client.jsm().delete_consumer(f"WORK_POOL_{lane.pool}", f"{lane.pool}_l4_default")
        second = _item(lane, 2)
        await transport.publish_work(_subject(lane), second)  # the next pull finds no consumer at all: 503
        assert [delivery.item for delivery in await consumer.fetch(1, LONG_WAIT_S)] == [second]


async def test_no_url_and_no_server_are_unavailable(tmp_path: Path) -> None:
    with pytest.raises(TransportUnavailable, match="SIE_NATS_URL"):
        async with NatsTransport(NatsSettings(url=None)):
            pass
    server = NatsServer(tmp_path)
    url = server.url
    server.stop()
    started = time.monotonic()
    with pytest.raises(TransportUnavailable, match="cannot connect"):
        async with _transport(url):
            pass
    assert time.monotonic() - started < 10.0


async def test_a_lost_broker_is_unavailable_until_it_comes_back(tmp_path: Path, lane: Lane) -> None:
    server = NatsServer(tmp_path)
    try:
        async with _transport(server.url) as transport:
            await transport.publish_work(_subject(lane), _item(lane))
            server.stop()
            await eventually(lambda: _publish_fails(transport, lane), timeout_s=LONG_WAIT_S)
            server = NatsServer(tmp_path, port=server.port)  # same port, same file store directory
            await eventually(lambda: _publish_works(transport, lane), timeout_s=15.0)
    finally:
        server.stop()


async def _pending_is(transport: NatsTransport, pool: str, expected: int) -> bool:
    return await transport.pending(pool) == expected


async def _publish_fails(transport: NatsTransport, lane: Lane) -> bool:
    try:
        await transport.publish_work(_subject(lane), _item(lane))
    except TransportUnavailable:
        return True
    return False


async def _publish_works(transport: NatsTransport, lane: Lane) -> bool:
    return not await _publish_fails(transport, lane)
