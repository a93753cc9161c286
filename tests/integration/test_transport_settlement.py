"""Settlement and pub/sub semantics every Transport keeps (seed 000 §8, DESIGN.md §4), written once.

The `open_transport` fixture is parametrised over implementations; add one by adding a factory to
TRANSPORT_FACTORIES (a real nats-server one needs only `request.getfixturevalue` for its server).
Test bodies use the protocol alone: waits are fetch timeouts or a deadline poll, never sleeps.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest

from sie.catalog.names import (
    MAX_DELIVERIES_ADVISORY,
    inbox_wildcard,
    reply_subject,
    work_consumer_name,
    work_pool_stream_name,
    work_subject,
)
from sie.settings import StreamSettings
from sie.settings.messaging import NatsSettings
from sie.transport.base import (
    AlreadySettledError,
    BackpressureError,
    Delivery,
    Lane,
    LaneConsumer,
    LaneDepth,
    MaxDeliveriesAdvisory,
    Transport,
    TransportUnavailable,
)
from sie.transport.loopback import LoopbackTransport
from sie.transport.nats import NatsTransport
from sie.wire.queue import WorkItem, WorkResult
from support.polling import eventually

TransportFactory = Callable[[pytest.FixtureRequest, StreamSettings], AbstractAsyncContextManager[Transport]]
OpenTransport = Callable[..., AbstractAsyncContextManager[Transport]]


def _loopback(request: pytest.FixtureRequest, settings: StreamSettings) -> AbstractAsyncContextManager[Transport]:
    return LoopbackTransport(settings)


def _nats(request: pytest.FixtureRequest, settings: StreamSettings) -> AbstractAsyncContextManager[Transport]:
    server = request.getfixturevalue("nats_server")
    return NatsTransport(NatsSettings(url=server.url), settings)


TRANSPORT_FACTORIES: dict[str, TransportFactory] = {"loopback": _loopback, "nats": _nats}

# Short enough to keep the suite fast, long enough that a loaded CI machine does not see early redelivery.
ACK_WAIT_S = 0.5
SHORT_WAIT_S = 0.1
LONG_WAIT_S = 5.0
MODEL = "BAAI/bge-m3"


@pytest.fixture(params=["loopback", "nats"])
def open_transport(request: pytest.FixtureRequest) -> OpenTransport:
    """`async with open_transport(max_msgs=3, ...) as transport:`, keyword arguments are StreamSettings fields."""
    factory = TRANSPORT_FACTORIES[request.param]

    @asynccontextmanager
    async def open_(**overrides: Any) -> AsyncIterator[Transport]:
        settings = StreamSettings(**{"ack_wait_s": ACK_WAIT_S, "max_deliver": 5, **overrides})
        async with factory(request, settings) as transport:
            yield transport

    return open_


@pytest.fixture
async def transport(open_transport: OpenTransport) -> AsyncIterator[Transport]:
    async with open_transport() as opened:
        yield opened


@pytest.fixture
def pool() -> str:
    """A pool of its own per test, so durable state on a shared broker never leaks between tests."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def lane(pool: str) -> Lane:
    return Lane(pool=pool, machine_profile="l4", bundle="default")


_ids = itertools.count()


def make_item(lane: Lane, model: str = MODEL) -> WorkItem:
    index = next(_ids)
    return WorkItem(
        work_item_id=f"req-{index}.0",
        request_id=f"req-{index}",
        item_index=0,
        total_items=1,
        operation="encode",
        model_id=model,
        profile_id="default",
        pool_name=lane.pool,
        machine_profile=lane.machine_profile,
        router_id="gw-1",
        reply_subject=reply_subject("gw-1", f"req-{index}"),
        timestamp=time.time(),
        item={"text": f"hello {index}"},
    )


async def publish(transport: Transport, lane: Lane, model: str = MODEL) -> WorkItem:
    item = make_item(lane, model)
    await transport.publish_work(work_subject(lane.pool, lane.machine_profile, lane.bundle, model), item)
    return item


async def fetch_one(consumer: LaneConsumer, timeout_s: float = LONG_WAIT_S) -> Delivery:
    deliveries = await consumer.fetch(1, timeout_s)
    assert len(deliveries) == 1, "expected one delivery before the timeout"
    return deliveries[0]


async def assert_nothing(consumer: LaneConsumer, timeout_s: float = SHORT_WAIT_S) -> None:
    assert await consumer.fetch(10, timeout_s) == []


# Settlement


async def test_ack_removes_the_message(transport: Transport, lane: Lane) -> None:
    consumer = await transport.consumer(lane)
    item = await publish(transport, lane)
    delivery = await fetch_one(consumer)
    assert delivery.item == item
    assert delivery.num_delivered == 1
    assert delivery.subject == work_subject(lane.pool, lane.machine_profile, lane.bundle, MODEL)
    await delivery.ack()
    await eventually(lambda: _pending_is(transport, lane.pool, 0), timeout_s=LONG_WAIT_S)
    await assert_nothing(consumer, ACK_WAIT_S + SHORT_WAIT_S)


async def test_nak_redelivers_with_num_delivered_two(transport: Transport, lane: Lane) -> None:
    consumer = await transport.consumer(lane)
    item = await publish(transport, lane)
    await (await fetch_one(consumer)).nak()
    again = await fetch_one(consumer)
    assert again.item == item
    assert again.num_delivered == 2
    await again.ack()


async def test_nak_delay_holds_the_message_until_the_delay(transport: Transport, lane: Lane) -> None:
    consumer = await transport.consumer(lane)
    await publish(transport, lane)
    delay_s = 0.4
    naked_at = time.monotonic()
    await (await fetch_one(consumer)).nak(delay_s)
    await assert_nothing(consumer, SHORT_WAIT_S)
    again = await fetch_one(consumer)
    assert time.monotonic() - naked_at >= delay_s - 0.02
    assert again.num_delivered == 2
    await again.ack()


async def test_unacked_delivery_is_redelivered_after_ack_wait(transport: Transport, lane: Lane) -> None:
    consumer = await transport.consumer(lane)
    item = await publish(transport, lane)
    fetched_at = time.monotonic()
    first = await fetch_one(consumer)
    again = await fetch_one(consumer)
    assert time.monotonic() - fetched_at >= ACK_WAIT_S - 0.02
    assert again.item == item
    assert (first.num_delivered, again.num_delivered) == (1, 2)
    await again.ack()


async def test_in_progress_extends_the_ack_wait(transport: Transport, lane: Lane) -> None:
    consumer = await transport.consumer(lane)
    await publish(transport, lane)
    delivery = await fetch_one(consumer)
    started = time.monotonic()
    # Keep it alive well past one ack_wait; each empty fetch shows it was not redelivered meanwhile.
    while time.monotonic() - started < 2 * ACK_WAIT_S:
        await delivery.in_progress()
        await assert_nothing(consumer, ACK_WAIT_S / 4)
    await delivery.in_progress()
    stopped = time.monotonic()
    again = await fetch_one(consumer)
    assert time.monotonic() - stopped >= ACK_WAIT_S - 0.02
    assert again.num_delivered == 2
    await again.ack()


async def test_max_deliver_stops_redelivery_advises_and_the_dead_letters_take_the_work(
    open_transport: OpenTransport, lane: Lane
) -> None:
    advisories: list[tuple[str, MaxDeliveriesAdvisory]] = []
    async with open_transport(max_deliver=3) as transport:
        await transport.subscribe(
            MAX_DELIVERIES_ADVISORY,
            lambda subject, message: advisories.append((subject, message)),
            MaxDeliveriesAdvisory,
        )
        consumer = await transport.consumer(lane)
        item = await publish(transport, lane)
        subject = work_subject(lane.pool, lane.machine_profile, lane.bundle, MODEL)
        for attempt in (1, 2, 3):
            delivery = await fetch_one(consumer)
            assert delivery.num_delivered == attempt
            await delivery.nak()
        # JetStream advises once a pull request finds the message spent; fetching is what sidecars always do.
        await assert_nothing(consumer, ACK_WAIT_S + SHORT_WAIT_S)
        await eventually(lambda: bool(advisories), timeout_s=LONG_WAIT_S)
        assert await transport.pending(lane.pool) == 1  # dead work stays in the stream until it is taken

        advisory_subject, advisory = advisories[0]
        letter = await transport.dead_letters().capture(advisory)
        assert letter is not None
        assert await transport.dead_letters().capture(advisory) is None  # taken once
        await eventually(lambda: _pending_is(transport, lane.pool, 0), timeout_s=LONG_WAIT_S)
        assert await transport.dead_letters().get(letter.letter_id) == letter
        assert await transport.dead_letters().delete(letter.letter_id)
        assert await transport.dead_letters().get(letter.letter_id) is None

    stream, consumer_name = work_pool_stream_name(lane.pool), work_consumer_name(lane.pool, "l4", "default")
    assert advisory_subject == f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{consumer_name}"
    assert advisory.type == "io.nats.jetstream.advisory.v1.max_deliver"
    assert (advisory.stream, advisory.consumer, advisory.deliveries) == (stream, consumer_name, 3)
    assert (letter.subject, letter.item, letter.stream_seq) == (subject, item, advisory.stream_seq)
    assert (letter.stream, letter.consumer, letter.deliveries) == (stream, consumer_name, 3)


async def test_an_ack_after_progress_removes_without_redelivery(transport: Transport, lane: Lane) -> None:
    consumer = await transport.consumer(lane)
    await publish(transport, lane)
    delivery = await fetch_one(consumer)
    await delivery.in_progress()
    await delivery.ack()
    await eventually(lambda: _pending_is(transport, lane.pool, 0), timeout_s=LONG_WAIT_S)
    await assert_nothing(consumer, ACK_WAIT_S + SHORT_WAIT_S)


@pytest.mark.parametrize("first", ["ack", "nak"])
async def test_a_delivery_settles_once(transport: Transport, lane: Lane, first: str) -> None:
    consumer = await transport.consumer(lane)
    await publish(transport, lane)
    delivery = await fetch_one(consumer)
    await delivery.in_progress()
    await delivery.in_progress()
    await _settle(delivery, first)
    for verb in ("ack", "nak", "in_progress"):
        with pytest.raises(AlreadySettledError):
            await _settle(delivery, verb)


# Lanes, consumers and the stream


async def test_lanes_on_one_pool_do_not_steal_each_others_work(transport: Transport, pool: str) -> None:
    lane_a = Lane(pool=pool, machine_profile="l4", bundle="default")
    lane_b = Lane(pool=pool, machine_profile="l4", bundle="sglang")
    consumer_a, consumer_b = await transport.consumer(lane_a), await transport.consumer(lane_b)
    items_a = [await publish(transport, lane_a) for _ in range(3)]
    items_b = [await publish(transport, lane_b, model="intfloat/e5-base-v2") for _ in range(2)]
    assert await transport.pending(pool) == 5
    got_a = await _drain(consumer_a, 3)
    got_b = await _drain(consumer_b, 2)
    assert [delivery.item for delivery in got_a] == items_a
    assert [delivery.item for delivery in got_b] == items_b
    await assert_nothing(consumer_a)
    await assert_nothing(consumer_b)
    for delivery in got_a + got_b:
        await delivery.ack()


async def test_work_for_another_bundle_is_not_delivered(transport: Transport, lane: Lane) -> None:
    consumer = await transport.consumer(lane)
    other_bundle = work_subject(lane.pool, lane.machine_profile, "sglang", MODEL)
    await transport.publish_work(other_bundle, make_item(lane))
    await assert_nothing(consumer)
    assert await transport.pending(lane.pool) == 1


async def test_two_consumers_on_one_lane_split_the_work(transport: Transport, lane: Lane) -> None:
    first, second = await transport.consumer(lane), await transport.consumer(lane)
    items = [await publish(transport, lane) for _ in range(20)]
    seen: list[str] = []
    for consumer in itertools.islice(itertools.cycle((first, second)), 40):
        for delivery in await consumer.fetch(3, SHORT_WAIT_S):
            seen.append(delivery.item.work_item_id)
            await delivery.ack()
        if len(seen) == len(items):
            break
    assert sorted(seen) == sorted(item.work_item_id for item in items)
    await assert_nothing(first)
    await assert_nothing(second)


async def test_waiting_fetchers_on_one_lane_get_distinct_messages(transport: Transport, lane: Lane) -> None:
    first, second = await transport.consumer(lane), await transport.consumer(lane)
    waiting = [asyncio.ensure_future(consumer.fetch(1, LONG_WAIT_S)) for consumer in (first, second)]
    items = [await publish(transport, lane) for _ in range(2)]
    results = await asyncio.gather(*waiting)
    assert sorted(delivery.item.work_item_id for batch in results for delivery in batch) == sorted(
        item.work_item_id for item in items
    )


async def test_fetch_wakes_when_work_arrives(transport: Transport, lane: Lane) -> None:
    consumer = await transport.consumer(lane)
    fetching = asyncio.ensure_future(consumer.fetch(5, LONG_WAIT_S))
    await assert_nothing(await transport.consumer(lane), SHORT_WAIT_S)  # lets the fetch start waiting
    started = time.monotonic()
    item = await publish(transport, lane)
    deliveries = await fetching
    assert time.monotonic() - started < LONG_WAIT_S / 2
    assert [delivery.item for delivery in deliveries] == [item]


async def test_fetch_returns_what_is_there_up_to_max_items(transport: Transport, lane: Lane) -> None:
    consumer = await transport.consumer(lane)
    items = [await publish(transport, lane) for _ in range(5)]
    await eventually(lambda: _pending_is(transport, lane.pool, 5), timeout_s=LONG_WAIT_S)
    batch = await _drain(consumer, 3, max_items=3)
    rest = await _drain(consumer, 2, max_items=10)
    assert [delivery.item for delivery in batch + rest] == items


async def test_fetch_times_out_empty(transport: Transport, lane: Lane) -> None:
    consumer = await transport.consumer(lane)
    started = time.monotonic()
    assert await consumer.fetch(1, SHORT_WAIT_S) == []
    assert time.monotonic() - started >= SHORT_WAIT_S - 0.02


async def test_backpressure_at_max_msgs_recovers_after_an_ack(open_transport: OpenTransport, lane: Lane) -> None:
    async with open_transport(max_msgs=3) as transport:
        consumer = await transport.consumer(lane)
        for _ in range(3):
            await publish(transport, lane)
        with pytest.raises(BackpressureError):
            await publish(transport, lane)
        delivery = await fetch_one(consumer)
        with pytest.raises(BackpressureError):  # delivered but unacked still counts
            await publish(transport, lane)
        await delivery.ack()
        await eventually(lambda: _pending_is(transport, lane.pool, 2), timeout_s=LONG_WAIT_S)
        await publish(transport, lane)
        assert await transport.pending(lane.pool) == 3


async def test_pending_counts_queued_and_in_flight(transport: Transport, lane: Lane) -> None:
    assert await transport.pending(lane.pool) == 0
    consumer = await transport.consumer(lane)
    for _ in range(3):
        await publish(transport, lane)
    assert await transport.pending(lane.pool) == 3
    first = await fetch_one(consumer)
    assert await transport.pending(lane.pool) == 3
    await first.ack()
    await eventually(lambda: _pending_is(transport, lane.pool, 2), timeout_s=LONG_WAIT_S)


async def test_has_consumer_once_a_consumer_attaches(transport: Transport, lane: Lane) -> None:
    other = Lane(pool=lane.pool, machine_profile=lane.machine_profile, bundle="sglang")
    assert not await transport.has_consumer(lane)
    await transport.consumer(lane)
    assert await transport.has_consumer(lane)
    assert not await transport.has_consumer(other)


async def test_work_published_before_a_consumer_waits_for_it(transport: Transport, lane: Lane) -> None:
    items = [await publish(transport, lane) for _ in range(2)]
    assert not await transport.has_consumer(lane)
    assert await transport.pending(lane.pool) == 2
    consumer = await transport.consumer(lane)
    deliveries = await _drain(consumer, 2)
    assert [delivery.item for delivery in deliveries] == items


async def test_a_closed_transport_is_unavailable(open_transport: OpenTransport, lane: Lane) -> None:
    async with open_transport() as transport:
        consumer = await transport.consumer(lane)
        await publish(transport, lane)
        delivery = await fetch_one(consumer)
    with pytest.raises(TransportUnavailable):
        await publish(transport, lane)
    with pytest.raises(TransportUnavailable):
        await transport.consumer(lane)
    with pytest.raises(TransportUnavailable):
        await consumer.fetch(1, SHORT_WAIT_S)
    with pytest.raises(TransportUnavailable):
        await delivery.ack()
    with pytest.raises(TransportUnavailable):
        await transport.publish("sie.health.w1", {"ok": True})
    with pytest.raises(TransportUnavailable):
        await transport.subscribe("sie.health.>", lambda subject, message: None)


# Bus


async def test_result_wildcard_matches_one_router_only(transport: Transport) -> None:
    received: list[WorkResult] = []
    await transport.subscribe_results(inbox_wildcard("gw-1"), received.append)
    mine, theirs, last = _result("r1"), _result("r2"), _result("r3")
    await transport.publish_result(reply_subject("gw-2", "r2"), theirs)
    await transport.publish_result(reply_subject("gw-1", "r1"), mine)
    await transport.publish_result("_INBOX.gw-1", theirs)  # `>` needs at least one more token
    await transport.publish_result(reply_subject("gw-1", "r3"), last)
    await transport.flush()
    await eventually(lambda: len(received) >= 2, timeout_s=LONG_WAIT_S)
    assert received == [mine, last]


async def test_sync_and_async_handlers_both_receive(transport: Transport) -> None:
    sync_seen: list[tuple[str, Any]] = []
    async_seen: list[tuple[str, Any]] = []

    async def on_message(subject: str, message: Any) -> None:
        await asyncio.sleep(0)
        async_seen.append((subject, message))

    await transport.subscribe("sie.health.*", lambda subject, message: sync_seen.append((subject, message)))
    await transport.subscribe("sie.health.>", on_message)
    await transport.publish("sie.health.worker-1", {"worker_id": "worker-1"})
    await transport.flush()
    await eventually(lambda: bool(sync_seen) and bool(async_seen), timeout_s=LONG_WAIT_S)
    assert sync_seen == async_seen == [("sie.health.worker-1", {"worker_id": "worker-1"})]


async def test_unsubscribe_stops_delivery(transport: Transport) -> None:
    stopped: list[Any] = []
    sentinel: list[Any] = []
    subscription = await transport.subscribe("sie.config.models.default", lambda subject, message: stopped.append(1))
    await transport.subscribe("sie.config.models._all", lambda subject, message: sentinel.append(1))
    await transport.publish("sie.config.models.default", {"epoch": 1})
    await eventually(lambda: stopped == [1], timeout_s=LONG_WAIT_S)
    await subscription.unsubscribe()
    await transport.publish("sie.config.models.default", {"epoch": 2})
    await transport.publish("sie.config.models._all", {"epoch": 2})
    await eventually(lambda: sentinel == [1], timeout_s=LONG_WAIT_S)
    assert stopped == [1]


async def test_a_raising_handler_does_not_stop_the_others(transport: Transport) -> None:
    received: list[WorkResult] = []

    def broken(result: WorkResult) -> None:
        raise RuntimeError("handler bug")

    async def broken_async(result: WorkResult) -> None:
        raise RuntimeError("async handler bug")

    await transport.subscribe_results("_INBOX.gw-1.>", broken)
    await transport.subscribe_results("_INBOX.gw-1.>", broken_async)
    await transport.subscribe_results("_INBOX.gw-1.>", received.append)
    first, second = _result("r1"), _result("r2")
    await transport.publish_result(reply_subject("gw-1", "r1"), first)
    await transport.publish_result(reply_subject("gw-1", "r2"), second)
    await eventually(lambda: len(received) == 2, timeout_s=LONG_WAIT_S)
    assert received == [first, second]


# helpers


async def _pending_is(transport: Transport, pool: str, expected: int) -> bool:
    return await transport.pending(pool) == expected


async def _settle(delivery: Delivery, verb: str) -> None:
    await getattr(delivery, verb)()


async def _drain(consumer: LaneConsumer, count: int, max_items: int = 10) -> list[Delivery]:
    """Fetch until `count` deliveries arrived (a broker may hand them out over several fetches)."""
    deliveries: list[Delivery] = []

    async def fetched_all() -> bool:
        if len(deliveries) < count:
            deliveries.extend(await consumer.fetch(min(max_items, count - len(deliveries)), LONG_WAIT_S))
        return len(deliveries) >= count

    await eventually(fetched_all, timeout_s=LONG_WAIT_S, interval_s=0, what=f"{count} deliveries")
    assert len(deliveries) == count
    return deliveries


def _result(request_id: str) -> WorkResult:
    return WorkResult(work_item_id=f"{request_id}.0", request_id=request_id, item_index=0, success=True)


async def test_submit_work_batch_queues_every_item_in_order(transport: Transport, lane: Lane) -> None:
    consumer = await transport.consumer(lane)
    items = [make_item(lane) for _ in range(5)]
    subject = work_subject(lane.pool, lane.machine_profile, lane.bundle, MODEL)
    await (await transport.submit_work_batch(subject, items))  # sent, then every item stored
    assert await transport.pending(lane.pool) == 5
    deliveries = []
    while len(deliveries) < 5:
        deliveries.extend(await consumer.fetch(5 - len(deliveries), LONG_WAIT_S))
    assert [d.item.work_item_id for d in deliveries] == [item.work_item_id for item in items]
    for delivery in deliveries:
        await delivery.ack()


# Lane depth (the gateway's lane queue series)


async def test_lane_depth_counts_the_lanes_pending_and_unacknowledged_work(transport: Transport, lane: Lane) -> None:
    assert await transport.lane_depth(lane) == LaneDepth()  # no stream, no consumer yet
    consumer = await transport.consumer(lane)
    other = Lane(lane.pool, "a100", lane.bundle)  # same pool stream, another lane: never counted here
    await transport.consumer(other)
    for _ in range(3):
        await publish(transport, lane)
    await publish(transport, other)

    async def depth_is(expected: LaneDepth) -> bool:
        return await transport.lane_depth(lane) == expected

    await eventually(lambda: depth_is(LaneDepth(pending=3)), what="three pending items")
    # fetch returns up to its count: on a busy broker the second item may come with a second call.
    delivered = await consumer.fetch(2, LONG_WAIT_S)
    delivered += await consumer.fetch(1, LONG_WAIT_S) if len(delivered) == 1 else []
    first, second = delivered
    await eventually(lambda: depth_is(LaneDepth(pending=1, ack_pending=2)), what="two delivered items")
    await first.ack()
    await eventually(lambda: depth_is(LaneDepth(pending=1, ack_pending=1)), what="one acknowledged item gone")
    assert await transport.lane_depth(other) == LaneDepth(pending=1)
    await second.ack()
