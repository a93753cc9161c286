"""ReconnectingTransport, the seam itself: a fake broker that refuses until it is `up`, then hands out in-process
LoopbackTransports as the inner transport (the NATS one is covered by tests/integration/test_nats_down_start.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sie.catalog.names import work_subject
from sie.transport.base import Lane, TransportUnavailable
from sie.transport.loopback import LoopbackTransport
from sie.transport.reconnecting import ReconnectingTransport
from sie.wire.queue import WorkItem, WorkResult
from support.polling import eventually

LANE = Lane(pool="default", machine_profile="l4", bundle="default")
SUBJECT = work_subject("default", "l4", "default", "BAAI/bge-m3")
REFUSAL = "connection refused by the fake broker"


def make_item() -> WorkItem:
    return WorkItem(
        work_item_id="r.0", request_id="r", item_index=0, total_items=1, operation="encode", model_id="BAAI/bge-m3",
        profile_id="default", pool_name="default", machine_profile="l4", router_id="gw-1",
        reply_subject="_INBOX.gw-1.r", timestamp=0.0,
    )  # fmt: skip


def make_result() -> WorkResult:
    return WorkResult(work_item_id="r.0", request_id="r", item_index=0, success=True)


class Unreachable:
    """What opening a transport gives while the broker is down: entering it fails as NatsTransport's does."""

    async def __aenter__(self) -> Any:
        raise TransportUnavailable(REFUSAL)

    async def __aexit__(self, *exc_info: object) -> None:
        return None


class FlakyLoopback(LoopbackTransport):
    """A loopback whose first `failures` subscribe calls fail, as a connection lost right after connect would, and
    whose first `consumer_failures` consumer calls fail, as a JetStream cluster electing its leaders answers."""

    def __init__(self, failures: int, consumer_failures: int = 0) -> None:
        super().__init__()
        self.failures = failures
        self.consumer_failures = consumer_failures

    async def subscribe(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise TransportUnavailable("lost the connection while subscribing")
        return await super().subscribe(*args, **kwargs)

    async def consumer(self, lane: Lane) -> Any:
        if self.consumer_failures > 0:
            self.consumer_failures -= 1
            raise TransportUnavailable("ensure stream WORK_POOL_default: NATS is unavailable (nats: timeout)")
        return await super().consumer(lane)


class Broker:
    """The fake broker: refuses while down; once up, each open is a fresh inner transport."""

    def __init__(self, subscribe_failures: int = 0, consumer_failures: int = 0) -> None:
        self.up = False
        self.attempts = 0
        self.opened: list[LoopbackTransport] = []
        self.subscribe_failures = subscribe_failures
        self.consumer_failures = consumer_failures

    def open(self) -> Any:
        self.attempts += 1
        if not self.up:
            return Unreachable()
        first = not self.opened
        inner = FlakyLoopback(self.subscribe_failures if first else 0, self.consumer_failures if first else 0)
        self.opened.append(inner)
        return inner


@pytest.fixture
def broker() -> Broker:
    return Broker()


@pytest.fixture
async def transport(broker: Broker) -> AsyncIterator[ReconnectingTransport]:
    reconnecting = ReconnectingTransport(broker.open, description="the fake broker", initial_backoff_s=0.001,
                                         max_backoff_s=0.01)  # fmt: skip
    async with reconnecting:
        yield reconnecting


async def connected(transport: ReconnectingTransport) -> None:
    await eventually(lambda: transport.unavailable_reason() is None, what="the connection")


async def until_refused(broker: Broker, attempts: int = 3) -> None:
    await eventually(lambda: broker.attempts >= attempts, what=f"{attempts} refused connection attempts")


async def test_every_call_that_needs_the_broker_raises_until_connected(
    broker: Broker, transport: ReconnectingTransport
) -> None:
    await until_refused(broker)
    calls = [
        transport.publish_work(SUBJECT, make_item()),
        transport.submit_work_batch(SUBJECT, [make_item()]),
        transport.pending("default"),
        transport.has_consumer(LANE),
        transport.worker_streams(),
        transport.publish_result("_INBOX.gw-1.r", make_result()),
        transport.publish("sie.health.w-1", {"ready": True}),
        transport.flush(),
    ]
    for call in calls:
        with pytest.raises(TransportUnavailable, match=REFUSAL):
            await call
    reason = transport.unavailable_reason()
    assert reason is not None and "the fake broker is not connected" in reason and REFUSAL in reason


async def test_subscriptions_made_before_connect_take_effect_once_connected(
    broker: Broker, transport: ReconnectingTransport
) -> None:
    messages: list[tuple[str, Any]] = []
    results: list[WorkResult] = []
    await transport.subscribe("sie.health.>", lambda subject, message: messages.append((subject, message)))
    await transport.subscribe_results("_INBOX.gw-1.>", results.append)
    await until_refused(broker)

    broker.up = True
    await connected(transport)

    assert transport.unavailable_reason() is None
    result = make_result()
    await transport.publish("sie.health.w-1", {"ready": True})
    await transport.publish_result("_INBOX.gw-1.r", result)
    assert messages == [("sie.health.w-1", {"ready": True})]
    assert results == [result]


async def test_a_subscription_dropped_before_connect_is_never_made(
    broker: Broker, transport: ReconnectingTransport
) -> None:
    kept: list[Any] = []
    dropped: list[Any] = []
    await transport.subscribe("sie.config.>", lambda subject, message: kept.append(message))
    subscription = await transport.subscribe("sie.config.>", lambda subject, message: dropped.append(message))
    await subscription.unsubscribe()

    broker.up = True
    await connected(transport)
    await transport.publish("sie.config.models._all", "delta")

    assert (kept, dropped) == (["delta"], [])


async def test_a_subscription_made_before_connect_can_be_dropped_after(
    broker: Broker, transport: ReconnectingTransport
) -> None:
    received: list[Any] = []
    subscription = await transport.subscribe("work_cancel.>", lambda subject, message: received.append(message))
    broker.up = True
    await connected(transport)
    await transport.publish("work_cancel.gw-1.r1", "first")

    await subscription.unsubscribe()
    await transport.publish("work_cancel.gw-1.r2", "second")

    assert received == ["first"]


async def test_a_failed_subscribe_on_connect_makes_the_whole_attempt_again() -> None:
    broker = Broker(subscribe_failures=1)
    broker.up = True
    received: list[Any] = []
    async with ReconnectingTransport(broker.open, initial_backoff_s=0.001) as transport:
        await transport.subscribe("sie.health.>", lambda subject, message: received.append(message))
        await connected(transport)
        await transport.publish("sie.health.w-1", "beat")

    assert len(broker.opened) == 2  # the first inner transport was closed with its failed subscription
    assert received == ["beat"]


async def test_a_lane_consumer_taken_before_connect_attaches_on_its_first_fetch_after(
    broker: Broker, transport: ReconnectingTransport
) -> None:
    lane = await transport.consumer(LANE)
    assert await lane.fetch(1, 0.01) == []  # waits for the connection up to the timeout, then finds nothing

    broker.up = True
    await connected(transport)
    await transport.publish_work(SUBJECT, make_item())

    deliveries = await lane.fetch(1, 5.0)
    assert [delivery.item.work_item_id for delivery in deliveries] == ["r.0"]
    await deliveries[0].ack()
    assert await transport.pending("default") == 0


async def test_a_lane_consumer_the_connected_broker_cannot_make_yet_is_made_on_a_later_fetch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = Broker(consumer_failures=2)
    broker.up = True
    async with ReconnectingTransport(broker.open, description="the fake broker", initial_backoff_s=0.001,
                                     max_backoff_s=0.01) as transport:  # fmt: skip
        await connected(transport)
        with caplog.at_level(logging.WARNING, logger="sie.transport.reconnecting"):
            lane = await transport.consumer(LANE)  # the first try fails: no exception, a consumer made later
        assert "cannot be made yet" in caplog.text and "nats: timeout" in caplog.text
        await transport.publish_work(SUBJECT, make_item())

        with pytest.raises(TransportUnavailable):  # the second try, on the first fetch: the fetch loop retries
            await lane.fetch(1, 0.01)
        deliveries = await lane.fetch(1, 5.0)
        assert [delivery.item.work_item_id for delivery in deliveries] == ["r.0"]
        assert broker.opened[0].consumer_failures == 0


async def test_a_worker_consumer_taken_before_connect_finds_nothing_where_the_inner_has_no_direct_dispatch(
    broker: Broker, transport: ReconnectingTransport
) -> None:
    direct = await transport.worker_consumer(LANE, "w-1")
    assert direct is not None  # the inner transport is not known yet
    assert await direct.fetch(1, 0.01) == []

    broker.up = True
    await connected(transport)
    assert await transport.worker_consumer(LANE, "w-1") is None  # the loopback has no direct dispatch
    assert await direct.fetch(1, 0.01) == []  # attached to nothing: each fetch waits out its timeout
    assert await direct.fetch(1, 0.01) == []


async def test_once_connected_calls_reach_the_inner_transport(broker: Broker, transport: ReconnectingTransport) -> None:
    broker.up = True
    await connected(transport)
    lane = await transport.consumer(LANE)
    assert await transport.has_consumer(LANE)

    await (await transport.submit_work_batch(SUBJECT, [make_item()]))
    stored = await transport.submit_work_batch(SUBJECT, [make_item()])
    await stored
    await transport.flush()

    assert await transport.pending("default") == 2
    assert len(await lane.fetch(2, 5.0)) == 2
    assert await transport.worker_streams() == []  # the in-process inner transport has no worker streams


async def test_the_outage_is_one_warning_and_the_connection_one_info_line(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sie.transport.reconnecting")
    async with ReconnectingTransport(broker.open, description="the fake broker", initial_backoff_s=0.001) as transport:
        await until_refused(broker, attempts=4)
        broker.up = True
        await connected(transport)

    records = [record for record in caplog.records if record.name == "sie.transport.reconnecting"]
    warnings = [record.getMessage() for record in records if record.levelno >= logging.WARNING]
    infos = [record.getMessage() for record in records if record.levelno == logging.INFO]
    assert warnings == [f"the fake broker is unreachable; serving without it and retrying in the background: {REFUSAL}"]
    assert infos == ["connected to the fake broker"]
    assert not any(record.exc_info for record in records)


async def test_leaving_before_connect_stops_trying_and_later_calls_raise(broker: Broker) -> None:
    transport = ReconnectingTransport(broker.open, initial_backoff_s=0.001)
    async with transport:
        lane = await transport.consumer(LANE)
        await until_refused(broker)
        waiting = asyncio.ensure_future(lane.fetch(1, 60.0))  # waits for the connection
        await asyncio.sleep(0)
    attempts = broker.attempts

    with pytest.raises(TransportUnavailable, match="closed"):
        await waiting
    with pytest.raises(TransportUnavailable, match="closed"):
        await lane.fetch(1, 0.01)
    with pytest.raises(TransportUnavailable, match="closed"):
        await transport.subscribe("sie.health.>", lambda subject, message: None)
    with pytest.raises(TransportUnavailable, match="closed"):
        await transport.publish("sie.health.w-1", {})
    assert broker.attempts == attempts  # no attempt after exit


async def test_leaving_closes_the_inner_transport(broker: Broker) -> None:
    broker.up = True
    async with ReconnectingTransport(broker.open) as transport:
        await connected(transport)
    (inner,) = broker.opened

    with pytest.raises(TransportUnavailable):
        await inner.publish("sie.health.w-1", {})
    with pytest.raises(TransportUnavailable, match="closed"):
        await transport.consumer(LANE)


class CancellationAsRefusal:
    """An open that waits, and (`swallow`) turns a cancellation into a refusal, as asyncio.wait_for inside nats-py's
    connect can (Python 3.11) when the cancel lands as the attempt fails: the connect task goes on as if the attempt
    had failed."""

    def __init__(self, swallow: bool) -> None:
        self.swallow = swallow
        self.waiting = asyncio.Event()

    async def __aenter__(self) -> Any:
        self.waiting.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            if self.swallow:
                raise TransportUnavailable(REFUSAL) from None
            raise
        raise AssertionError("not reached")

    async def __aexit__(self, *exc_info: object) -> None:
        return None


async def test_exit_ends_the_connect_loop_even_when_an_attempt_swallows_the_cancellation() -> None:
    opens: list[CancellationAsRefusal] = []

    def open_transport() -> CancellationAsRefusal:
        opens.append(CancellationAsRefusal(swallow=not opens))  # the race happens once; later opens cancel plainly
        return opens[-1]

    transport = ReconnectingTransport(open_transport, initial_backoff_s=0.01)
    await transport.__aenter__()
    for _ in range(500):  # the connect task's first attempt starts
        if opens and opens[0].waiting.is_set():
            break
        await asyncio.sleep(0.01)
    assert len(opens) == 1 and opens[0].waiting.is_set()
    await asyncio.wait_for(transport.__aexit__(None, None, None), 5)  # before: retried for good, exit never returned
    assert len(opens) == 1
    assert transport.unavailable_reason() is not None
