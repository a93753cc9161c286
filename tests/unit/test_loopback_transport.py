"""Loopback-only behaviour beyond the shared settlement suite: by-reference passing, dead work staying in the
stream until the dead letters take it, the dead letters' bounds, max_age, stale deliveries, fetcher wake-ups and
shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from sie.catalog.names import MAX_DELIVERIES_ADVISORY, work_subject, work_worker_subject
from sie.settings import StreamSettings
from sie.transport.base import (
    BackpressureError,
    Lane,
    MaxDeliveriesAdvisory,
    NoConsumerError,
    TransportError,
    TransportUnavailable,
)
from sie.transport.loopback import LoopbackTransport
from sie.transport.loopback.dead_letters import LoopbackDeadLetterStore
from sie.transport.loopback.stream import REMOVED, LaneQueue, LoopbackLaneConsumer, StoredMessage
from sie.wire.queue import WorkItem, WorkResult
from support.polling import eventually

LANE = Lane(pool="default", machine_profile="l4", bundle="default")
SUBJECT = work_subject("default", "l4", "default", "BAAI/bge-m3")


def make_item(index: int = 0) -> WorkItem:
    return WorkItem(
        work_item_id=f"r.{index}",
        request_id="r",
        item_index=index,
        total_items=1,
        operation="encode",
        model_id="BAAI/bge-m3",
        profile_id="default",
        pool_name="default",
        machine_profile="l4",
        router_id="gw-1",
        reply_subject="_INBOX.gw-1.r",
        timestamp=0.0,
    )


@pytest.fixture
async def transport() -> AsyncIterator[LoopbackTransport]:
    async with LoopbackTransport(StreamSettings(ack_wait_s=0.2, max_deliver=2, max_msgs=4)) as opened:
        yield opened


async def wait_for_pending(transport: LoopbackTransport, expected: int) -> None:
    async def reached() -> bool:
        return await transport.pending(LANE.pool) == expected

    await eventually(reached, what=f"pending to reach {expected}")


async def until_waiting(consumer: LoopbackLaneConsumer, count: int) -> None:
    await eventually(lambda: len(consumer._lane._waiters) >= count, what=f"{count} fetchers waiting")


async def test_items_and_results_travel_by_reference(transport: LoopbackTransport) -> None:
    item = make_item()
    await transport.publish_work(SUBJECT, item)
    (delivery,) = await (await transport.consumer(LANE)).fetch(1, 1.0)
    assert delivery.item is item
    received: list[WorkResult] = []
    await transport.subscribe_results("_INBOX.gw-1.>", received.append)
    result = WorkResult(work_item_id="r.0", request_id="r", item_index=0, success=True)
    await transport.publish_result("_INBOX.gw-1.r", result)
    assert received[0] is result  # delivered before publish_result returns


async def test_dead_work_stays_in_the_stream_until_the_dead_letters_take_it(transport: LoopbackTransport) -> None:
    advisories: list[MaxDeliveriesAdvisory] = []
    await transport.subscribe(MAX_DELIVERIES_ADVISORY, lambda subject, advisory: advisories.append(advisory))
    consumer = await transport.consumer(LANE)
    items = [make_item(index) for index in range(4)]
    for item in items:
        await transport.publish_work(SUBJECT, item)
    for _ in range(2):  # max_deliver=2
        for delivery in await consumer.fetch(4, 1.0):
            await delivery.nak()
    await eventually(lambda: len(advisories) == 4, what="four advisories")
    assert await transport.pending(LANE.pool) == 4  # as on JetStream: dead work still counts toward max_msgs
    with pytest.raises(BackpressureError):
        await transport.publish_work(SUBJECT, make_item(9))
    assert await consumer.fetch(4, 0.05) == []

    letters = [await transport.dead_letters().capture(advisory) for advisory in advisories]
    assert [letter.item for letter in letters if letter is not None] == items  # by reference, in order
    assert await transport.pending(LANE.pool) == 0
    await transport.publish_work(SUBJECT, make_item(9))
    assert await transport.dead_letters().capture(advisories[0]) is None


async def test_the_dead_letters_are_bounded_and_age_out() -> None:
    now = [1000.0]
    transport = LoopbackTransport(StreamSettings(max_deliver=1))
    store = LoopbackDeadLetterStore(transport._stream_named, max_letters=2, max_age_s=60.0, clock=lambda: now[0])
    advisories: list[MaxDeliveriesAdvisory] = []
    async with transport:
        await transport.subscribe(MAX_DELIVERIES_ADVISORY, lambda subject, advisory: advisories.append(advisory))
        consumer = await transport.consumer(LANE)
        for index in range(3):
            await transport.publish_work(SUBJECT, make_item(index))
        for delivery in await consumer.fetch(3, 1.0):
            await delivery.nak()
        await eventually(lambda: len(advisories) == 3, what="three advisories")
        for advisory in advisories:
            await store.capture(advisory)
        assert [letter.letter_id for letter in await store.letters(0, 10)] == [2, 3]  # the oldest went first
        assert [letter.letter_id for letter in await store.letters(2, 10)] == [3]
        now[0] += 61.0
        assert await store.letters(0, 10) == []
        assert await store.purge() == 0


async def test_messages_older_than_max_age_are_dropped() -> None:
    async with LoopbackTransport(StreamSettings(max_age_s=0.05, ack_wait_s=5.0)) as transport:
        consumer = await transport.consumer(LANE)
        await transport.publish_work(SUBJECT, make_item(0))
        (delivered,) = await consumer.fetch(1, 1.0)
        await transport.publish_work(SUBJECT, make_item(1))
        await wait_for_pending(transport, 0)
        assert await consumer.fetch(1, 0.05) == []
        await delivered.ack()  # acking expired work is harmless, as on JetStream
        await transport.publish_work(SUBJECT, make_item(2))
        (fresh,) = await consumer.fetch(1, 1.0)
        assert fresh.item.item_index == 2


async def test_a_stale_delivery_acks_by_sequence_and_its_nak_is_ignored(transport: LoopbackTransport) -> None:
    consumer = await transport.consumer(LANE)
    await transport.publish_work(SUBJECT, make_item())
    (stale,) = await consumer.fetch(1, 1.0)
    (current,) = await consumer.fetch(1, 1.0)  # redelivered after ack_wait
    assert current.num_delivered == 2
    await stale.in_progress()  # does not extend someone else's delivery
    await stale.ack()
    assert await transport.pending(LANE.pool) == 0
    await current.nak()  # the message is gone; nothing to redeliver
    assert await consumer.fetch(1, 0.05) == []


async def test_a_nak_on_a_redelivered_message_from_the_old_delivery_is_ignored(transport: LoopbackTransport) -> None:
    consumer = await transport.consumer(LANE)
    await transport.publish_work(SUBJECT, make_item())
    (stale,) = await consumer.fetch(1, 1.0)
    (current,) = await consumer.fetch(1, 1.0)
    await stale.nak()
    assert await consumer.fetch(1, 0.05) == []
    await current.ack()
    assert await transport.pending(LANE.pool) == 0


async def test_timed_out_fetches_leave_no_waiters(transport: LoopbackTransport) -> None:
    consumer = await transport.consumer(LANE)
    for _ in range(3):
        assert await consumer.fetch(1, 0.01) == []
    assert not consumer._lane._waiters


async def test_a_cancelled_fetcher_hands_its_wake_up_on(transport: LoopbackTransport) -> None:
    first, second = await transport.consumer(LANE), await transport.consumer(LANE)
    cancelled = asyncio.ensure_future(first.fetch(1, 5.0))
    await until_waiting(first, 1)
    survivor = asyncio.ensure_future(second.fetch(1, 5.0))
    await until_waiting(first, 2)  # both wait on the one lane, `cancelled` first in line
    item = make_item()
    await transport.publish_work(SUBJECT, item)  # wakes `cancelled` ...
    cancelled.cancel()  # ... which is cancelled before it runs
    (delivery,) = await asyncio.wait_for(survivor, 1.0)
    assert delivery.item is item
    with pytest.raises(asyncio.CancelledError):
        await cancelled


async def test_closing_wakes_a_waiting_fetcher() -> None:
    transport = LoopbackTransport()
    async with transport:
        consumer = await transport.consumer(LANE)
        fetching = asyncio.ensure_future(consumer.fetch(1, 30.0))
        await until_waiting(consumer, 1)
    with pytest.raises(TransportUnavailable):
        await asyncio.wait_for(fetching, 1.0)


async def test_closing_with_timers_and_advisories_pending_is_clean() -> None:
    async with LoopbackTransport(StreamSettings(max_deliver=1)) as transport:
        await transport.subscribe("$JS.EVENT.>", lambda subject, message: None)
        consumer = await transport.consumer(LANE)
        for index in range(3):
            await transport.publish_work(SUBJECT, make_item(index))
        first, second, third = await consumer.fetch(3, 1.0)
        await first.nak(30.0)  # max_deliver=1: dead, its advisory task is still pending at exit
        await second.in_progress()
    assert not transport._tasks


async def test_unusable_outside_async_with() -> None:
    transport = LoopbackTransport()
    with pytest.raises(TransportUnavailable, match="not started"):
        await transport.publish_work(SUBJECT, make_item())
    async with transport:
        pass
    with pytest.raises(TransportUnavailable):
        async with transport:
            pass


async def test_a_subject_no_pool_stream_captures_is_rejected(transport: LoopbackTransport) -> None:
    with pytest.raises(TransportError, match="no stream captures"):
        await transport.publish_work("sie.health.w1", make_item())
    with pytest.raises(TransportError, match="no stream captures"):
        await transport.publish_work("sie.work.default.l4.default.m.w1.extra", make_item())
    assert await transport.pending("default") == 0


async def test_in_process_there_is_no_worker_direct_dispatch(transport: LoopbackTransport) -> None:
    """One in-process sidecar serves each lane: no worker consumer, and a worker-subject publish is refused as
    no consumer (the gateway then publishes on the lane), never queued or dropped silently."""
    lane = Lane("default", "l4", "default")
    assert await transport.worker_consumer(lane, "w1") is None
    subject = work_worker_subject("default", "l4", "default", "m", "w1")
    with pytest.raises(NoConsumerError):
        await transport.publish_work(subject, make_item())
    with pytest.raises(NoConsumerError):
        await transport.submit_work_batch(subject, [make_item()])
    assert await transport.pending("default") == 0


async def test_fetch_needs_a_positive_max_items(transport: LoopbackTransport) -> None:
    with pytest.raises(ValueError, match="max_items"):
        await (await transport.consumer(LANE)).fetch(0, 0.1)


async def test_a_raising_handler_is_logged(transport: LoopbackTransport, caplog: pytest.LogCaptureFixture) -> None:
    def broken(subject: str, message: object) -> None:
        raise RuntimeError("handler bug")

    await transport.subscribe("sie.health.>", broken)
    with caplog.at_level(logging.ERROR, logger="sie.transport.loopback.bus"):
        await transport.publish("sie.health.w1", {})
    assert "sie.health.>" in caplog.text
    assert "handler bug" in caplog.text


async def test_a_handler_may_unsubscribe_itself_during_dispatch(transport: LoopbackTransport) -> None:
    calls: list[str] = []

    async def once(subject: str, message: object) -> None:
        calls.append(subject)
        await subscription.unsubscribe()

    subscription = await transport.subscribe("a.>", once)
    await transport.publish("a.b", None)
    await transport.publish("a.c", None)
    assert calls == ["a.b"]


def test_removed_ready_messages_are_compacted_away() -> None:
    loop = asyncio.new_event_loop()
    try:
        lane = LaneQueue("sie.work.default.l4.default", loop)
        messages = [StoredMessage(seq, SUBJECT, make_item(seq), lane, 0.0) for seq in range(200)]
        for message in messages:
            lane.push(message, redelivery=False)
        for message in messages[:150]:
            message.state = REMOVED
            lane.forget_ready()
        assert len(lane._fresh) < 100
        assert [message.seq for message in lane.pop(100)] == list(range(150, 200))
    finally:
        loop.close()
