"""The NATS bus on a real server: results skipped by the request-id scan before decoding, control messages as
JSON decoded into wire types, and payloads that do not decode dropped without stopping the subscription."""

from __future__ import annotations

import json
from typing import Any

from nats.aio.client import Client

from launcher import NatsServer
from sie.catalog.names import health_subject, reply_subject
from sie.settings.messaging import NatsSettings
from sie.transport.nats import NatsTransport
from sie.wire.health import WorkerHeartbeat
from sie.wire.queue import WorkResult
from support.polling import eventually


def _result(request_id: str) -> WorkResult:
    return WorkResult(work_item_id=f"{request_id}.0", request_id=request_id, item_index=0, success=True)


async def test_results_for_unwanted_requests_are_dropped_before_decoding(
    nats_server: NatsServer, nats_client: Client
) -> None:
    received: list[WorkResult] = []
    live = {"live-1", "live-2"}
    async with NatsTransport(NatsSettings(url=nats_server.url)) as transport:
        subscription = await transport.subscribe_results("_INBOX.gw-1.>", received.append, wants=live.__contains__)
        await transport.flush()  # the subscription is on the server before another connection publishes
        await transport.publish_result(reply_subject("gw-1", "gone"), _result("gone"))
        await transport.publish_result(reply_subject("gw-1", "live-1"), _result("live-1"))
        await nats_client.publish(reply_subject("gw-1", "live-2"), b"\xc1 broken")
        await transport.publish_result(reply_subject("gw-1", "live-2"), _result("live-2"))
        # The unwanted one and the undecodable one are dropped; neither stops the subscription.
        await eventually(lambda: len(received) == 2 and subscription.dropped == 2)
        assert received == [_result("live-1"), _result("live-2")]


async def test_control_messages_travel_as_json_and_decode_into_their_type(
    nats_server: NatsServer, nats_client: Client
) -> None:
    heartbeats: list[tuple[str, Any]] = []
    raw: list[bytes] = []
    beat = WorkerHeartbeat(
        worker_id="w1", pool="default", machine_profile="l4", bundle="default", ready=True, timestamp=1.5,
        loaded_models=["BAAI/bge-m3"],
    )  # fmt: skip
    async with NatsTransport(NatsSettings(url=nats_server.url)) as transport:
        subscription = await transport.subscribe(
            "sie.health.>", lambda subject, message: heartbeats.append((subject, message)), WorkerHeartbeat
        )
        await nats_client.subscribe("sie.health.>", cb=_appending_to(raw))
        await nats_client.flush()
        await transport.flush()
        await nats_client.publish(health_subject("w1"), b"{not json")
        await nats_client.publish(health_subject("w1"), b'{"worker_id": "w1"}')  # misses required fields
        await transport.publish(health_subject("w1"), beat)
        await eventually(lambda: bool(heartbeats) and subscription.dropped == 2 and len(raw) == 3)
    assert heartbeats == [("sie.health.w1", beat)]
    assert any(data.startswith(b"{") and b'"loaded_models":["BAAI/bge-m3"]' in data for data in raw)


async def test_plain_data_round_trips_as_json(nats_server: NatsServer) -> None:
    seen: list[Any] = []
    async with NatsTransport(NatsSettings(url=nats_server.url)) as transport:
        subscription = await transport.subscribe("work_cancel.gw-1.*", lambda subject, message: seen.append(message))
        await transport.publish("work_cancel.gw-1.r1", {"request_id": "r1", "reason": "client left"})
        await eventually(lambda: bool(seen))
        await subscription.unsubscribe()
        await subscription.unsubscribe()  # a second call does nothing
    assert seen == [{"request_id": "r1", "reason": "client left"}]


async def test_flush_returns_after_earlier_publishes_reached_the_server(
    nats_server: NatsServer, nats_client: Client
) -> None:
    # What another connection publishes after our flush returns must arrive after what we published before it.
    raw: list[bytes] = []
    await nats_client.subscribe("sie.flush.check", cb=_appending_to(raw))
    await nats_client.flush()
    async with NatsTransport(NatsSettings(url=nats_server.url)) as transport:
        for index in range(200):
            await transport.publish("sie.flush.check", {"before": index})
            await transport.flush()
            await nats_client.publish("sie.flush.check", b'{"after": %d}' % index)
        await eventually(lambda: len(raw) == 400)
    arrival = {tuple(json.loads(data).items())[0]: position for position, data in enumerate(raw)}
    assert all(arrival["before", index] < arrival["after", index] for index in range(200))


def _appending_to(into: list[bytes]) -> Any:
    async def append(msg: Any) -> None:
        into.append(msg.data)

    return append
