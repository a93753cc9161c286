"""Results sent while the gateway's broker connection is down (issue 33): results travel on core NATS, so one
published while the gateway reconnects is lost. On the transport's reconnect signal the gateway publishes the work
of every request still waiting again, and the answer comes from that second delivery. Real nats-server (file
storage, restarted on its port), the gateway app over ASGI, and the test as the worker, which answers the first
delivery never (its results are the lost ones)."""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import numpy as np
import pytest

from launcher import NatsServer
from sie.catalog import load_catalog
from sie.gateway.http.app import GatewaySources, build_gateway_app, collector_of
from sie.gateway.publisher import QueueConsumers
from sie.settings import GatewaySettings, LaneSettings, StreamSettings
from sie.settings.messaging import NatsSettings
from sie.transport.base import Lane, TransportUnavailable
from sie.transport.nats import NatsTransport
from sie.transport.reconnecting import ReconnectingTransport
from sie.wire import packb
from sie.wire.queue import WorkItem, WorkResult
from support.gateway_fakes import NoWorkers
from support.polling import eventually

REPO = Path(__file__).resolve().parents[2]
LANE = Lane("default", "default", "default")
ENCODE = "/v1/encode/sentence-transformers/all-MiniLM-L6-v2"


def encoded(item: WorkItem) -> WorkResult:
    values = np.array([len(item.item["text"]), 1.0], dtype=np.float32)
    payload = {"dense": {"dims": 2, "dtype": "float32", "values": values}}
    return WorkResult(work_item_id=item.work_item_id, request_id=item.request_id, item_index=item.item_index,
                      success=True, result_msgpack=packb(payload))  # fmt: skip


async def fetch_items(transport: NatsTransport, count: int) -> list[WorkItem]:
    """`count` work items off the lane, each ACKed (so the stream will not deliver it again by itself); fetches
    refused while the transport reconnects are tried again."""
    consumer = await transport.consumer(LANE)
    items: list[WorkItem] = []
    async with asyncio.timeout(20.0):
        while len(items) < count:
            try:
                deliveries = await consumer.fetch(count - len(items), 1.0)
            except TransportUnavailable:
                await asyncio.sleep(0.1)
                continue
            for delivery in deliveries:
                await delivery.ack()
                items.append(delivery.item)
    await transport.flush()  # the ACKs reached the broker
    return items


@pytest.mark.parametrize("reconnecting", [False, True], ids=["nats", "reconnecting"])
async def test_a_request_whose_results_were_sent_while_the_gateway_was_away_is_answered_from_its_republished_work(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, reconnecting: bool
) -> None:
    catalog = load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")
    server = NatsServer(tmp_path / "nats")
    port = server.port
    nats, streams = NatsSettings(url=server.url), StreamSettings(storage="file")
    try:
        async with AsyncExitStack() as stack:
            if reconnecting:  # as the roles open it: the listener is handed to the inner transport on connect
                gateway_transport = await stack.enter_async_context(
                    ReconnectingTransport(lambda: NatsTransport(nats, streams, name="sie-gateway-test"))
                )
                await eventually(lambda: gateway_transport.unavailable_reason() is None, timeout_s=10.0)
            else:
                gateway_transport = await stack.enter_async_context(NatsTransport(nats, streams))
            worker = await stack.enter_async_context(NatsTransport(nats, streams, name="worker"))
            await worker.consumer(LANE)  # the lane is served
            app = build_gateway_app(
                GatewaySources(lambda: catalog, gateway_transport, QueueConsumers(gateway_transport), NoWorkers()),
                GatewaySettings(request_timeout_s=30.0),
                LaneSettings(),
                "gw-reconnect",
            )
            await stack.enter_async_context(app.router.lifespan_context(app))
            client = await stack.enter_async_context(
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=40.0)
            )
            request = asyncio.ensure_future(client.post(ENCODE, json={"items": [{"text": "a"}, {"text": "bcd"}]}))
            first = await fetch_items(worker, 2)
            assert len(collector_of(app)) == 1

            # The broker goes away and comes back; whatever the worker sent for the first delivery is lost.
            await asyncio.to_thread(server.stop)
            with caplog.at_level(logging.INFO, logger="sie.gateway.collector"):
                server = await asyncio.to_thread(NatsServer, tmp_path / "nats", port)
                again = await fetch_items(worker, 2)
            assert {(item.request_id, item.item_index) for item in again} == {
                (item.request_id, item.item_index) for item in first
            }
            assert "asking again for the results of 1 requests" in caplog.text
            for item in again:
                await worker.publish_result(item.reply_subject, encoded(item))
            response = await request
            assert response.status_code == 200, response.text
            assert [len(item["dense"]["values"]) for item in response.json()["items"]] == [2, 2]
            assert [item["dense"]["values"][0] for item in response.json()["items"]] == [1.0, 3.0]
            await eventually(lambda: len(collector_of(app)) == 0, timeout_s=5.0)
    finally:
        server.stop()
