"""The config service while its NATS broker is unreachable (seed 000 §3 step 3.6, §13): it starts, answers
reads, refuses creating writes with 503 `nats_unavailable` without touching the epoch, and publishes once a
nats-server comes up on the configured port, without a restart."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import nats
import pytest
from nats.aio.msg import Msg

from launcher import NatsServer, RoleProcess, free_port
from sie.catalog.names import CONFIG_ALL_SUBJECT
from sie.control.auth import AccessPolicy
from sie.control.http.app import build_control_app
from sie.control.loading import load_registry
from sie.control.publisher import DeltaPublisher
from sie.control.writes import ConfigWriter
from sie.settings.messaging import NatsSettings
from sie.stores.config_store import MemoryConfigStore
from sie.transport.base import TransportUnavailable
from sie.transport.nats import NatsTransport
from sie.transport.reconnecting import ReconnectingTransport
from support.polling import eventually

REPO = Path(__file__).resolve().parents[2]
BUNDLES, MODELS = REPO / "config" / "bundles", REPO / "config" / "models"
ADAPTER = "sie.adapters.dense:OnnxDenseAdapter"
CONNECT_DEADLINE_S = 30.0


def model_yaml(model_id: str) -> str:
    profiles = f"  default:\n    adapter_path: {ADAPTER}\n    max_batch_tokens: 8192\n"
    return f"sie_id: {model_id}\nhf_id: {model_id}\nprofiles:\n{profiles}"


@pytest.fixture
def nats_url() -> str:
    """A URL where nothing listens yet (a test may start a nats-server on it)."""
    return f"nats://127.0.0.1:{free_port()}"


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[ReconnectingTransport]:
    settings = NatsSettings(url=nats_url)
    reconnecting = ReconnectingTransport(lambda: NatsTransport(settings), initial_backoff_s=0.1, max_backoff_s=0.5)
    async with reconnecting:
        yield reconnecting


@pytest.fixture
async def client(bus: ReconnectingTransport) -> AsyncIterator[httpx.AsyncClient]:
    registry = load_registry(BUNDLES, MODELS)
    writer = ConfigWriter(registry, MemoryConfigStore(), DeltaPublisher(bus), router_id="sie-config-0")
    app = build_control_app(writer, registry, AccessPolicy())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://config") as http:
        yield http


async def epoch(client: httpx.AsyncClient) -> int:
    return (await client.get("/v1/configs/epoch")).json()["epoch"]


async def test_reads_served_and_writes_refused_while_nats_is_unreachable(
    client: httpx.AsyncClient, bus: ReconnectingTransport
) -> None:
    assert bus.unavailable_reason() is not None
    assert (await client.get("/readyz")).status_code == 200
    assert (await client.get("/v1/configs/models")).status_code == 200
    assert await epoch(client) == 0

    refused = await client.post("/v1/configs/models", content=model_yaml("acme/outage"))

    assert refused.status_code == 503
    assert "nats_unavailable" in refused.text
    assert await epoch(client) == 0
    assert (await client.get("/v1/configs/models/acme/outage")).status_code == 404
    with pytest.raises(TransportUnavailable):
        await bus.publish(CONFIG_ALL_SUBJECT, {"probe": True})


async def test_publishes_once_nats_comes_up_without_restart(
    client: httpx.AsyncClient, bus: ReconnectingTransport, nats_url: str, tmp_path: Path
) -> None:
    assert (await client.post("/v1/configs/models", content=model_yaml("acme/early"))).status_code == 503

    server = NatsServer(tmp_path, port=int(nats_url.rsplit(":", 1)[1]))
    try:
        subscriber = await nats.connect(server.url)
        try:
            received: list[Msg] = []

            async def on_delta(message: Msg) -> None:
                received.append(message)

            await subscriber.subscribe(CONFIG_ALL_SUBJECT, cb=on_delta)
            await subscriber.flush()

            responses: list[httpx.Response] = []

            async def accepted() -> bool:
                responses.append(await client.post("/v1/configs/models", content=model_yaml("acme/late")))
                return responses[-1].status_code != 503

            await eventually(accepted, timeout_s=CONNECT_DEADLINE_S, interval_s=0.05, what="a write not refused")
            response = responses[-1]
            assert response.status_code == 201, response.text
            assert bus.unavailable_reason() is None
            assert await epoch(client) == 1
            await eventually(lambda: bool(received), timeout_s=CONNECT_DEADLINE_S, what="a delta on the _all subject")
            delta = json.loads(received[0].data)
            assert (delta["model_id"], delta["epoch"], delta["router_id"]) == ("acme/late", 1, "sie-config-0")
        finally:
            await subscriber.close()
    finally:
        server.stop()


def test_config_role_starts_while_nats_is_unreachable(nats_url: str, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = RoleProcess(
        "config", ["--host", "127.0.0.1", "--port", str(port)], {"SIE_NATS_URL": nats_url},
        tmp_path / "config.log",
    )  # fmt: skip
    try:
        process.wait_http_ready(f"{url}/readyz", timeout_s=60.0)
        assert httpx.get(f"{url}/v1/configs/models", timeout=5.0).status_code == 200
        refused = httpx.post(f"{url}/v1/configs/models", content=model_yaml("acme/outage"), timeout=5.0)
        assert refused.status_code == 503, refused.text
        assert "nats_unavailable" in refused.text
        assert process.process.poll() is None
    finally:
        assert process.stop() == 0, process.log()
