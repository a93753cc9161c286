"""The gateway's detached ACK drain on a real nats-server (seed 000 §8.2): the request path sends its work
items without waiting for JetStream's ACKs, and a refusal that arrives only in an ACK (a full stream, discard
new) still ends the request at once with the right answer and announces the cancel, instead of a 504."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import httpx

from launcher import NatsServer
from sie.catalog import load_catalog
from sie.gateway.http.app import GatewaySources, build_gateway_app, collector_of
from sie.gateway.publisher import QueueConsumers
from sie.settings import GatewaySettings, LaneSettings, StreamSettings
from sie.settings.messaging import NatsSettings
from sie.transport.base import Lane
from sie.transport.nats import NatsTransport
from support.gateway_fakes import NoWorkers
from support.polling import eventually

REPO = Path(__file__).resolve().parents[2]
LANE = Lane("default", "default", "default")
ENCODE = "/v1/encode/sentence-transformers/all-MiniLM-L6-v2"


async def test_a_refusal_in_the_ack_fails_the_request_at_once_and_cancels_it(nats_server: NatsServer) -> None:
    catalog = load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")
    timeout_s = 20.0
    async with AsyncExitStack() as stack:
        transport = await stack.enter_async_context(
            NatsTransport(NatsSettings(url=nats_server.url), StreamSettings(max_msgs=2))
        )
        await transport.consumer(LANE)  # the lane is served (nobody fetches): items stay queued
        cancels: list[str] = []
        await transport.subscribe("work_cancel.>", lambda subject, _: cancels.append(subject))
        app = build_gateway_app(
            GatewaySources(lambda: catalog, transport, QueueConsumers(transport), NoWorkers()),
            GatewaySettings(request_timeout_s=timeout_s),
            LaneSettings(),
            "gw-ack",
        )
        await stack.enter_async_context(app.router.lifespan_context(app))
        client = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
        )
        response = await client.post(ENCODE, json={"items": [{"text": "a"}, {"text": "b"}, {"text": "c"}]})
        assert response.status_code == 503, response.text  # from the ACK; the result timeout would be a 504
        assert response.json()["error"]["code"] == "QUEUE_FULL"
        assert response.headers["retry-after"] == "5"
        assert len(collector_of(app)) == 0
        await eventually(lambda: len(cancels) == 1, timeout_s=5.0)
        assert cancels[0].startswith("work_cancel.gw-ack.")
