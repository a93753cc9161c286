"""The gateway app served by hypercorn on a real socket, over HTTP/1.1 and h2c (HTTP/2 prior knowledge)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx
import numpy as np
import pytest
from hypercorn.asyncio import serve
from hypercorn.config import Config

from sie.catalog import load_catalog
from sie.gateway.app import build_gateway_app
from sie.settings import GatewaySettings
from sie.transport.base import Lane
from sie.transport.loopback import LoopbackTransport
from sie.wire import packb
from sie.wire.queue import WorkResult

REPO = Path(__file__).resolve().parents[2]
ENCODE = "/v1/encode/sentence-transformers/all-MiniLM-L6-v2"


class NoWorkers:
    def status(self, model_id: str) -> tuple[str, None]:
        return "available", None

    def workers(self) -> list:
        return []


async def answer_forever(transport: LoopbackTransport) -> None:
    consumer = await transport.consumer(Lane("default", "default", "default"))
    values = np.array([0.5, -1.0, 2.0], dtype=np.float32)
    payload = packb({"dense": {"dims": 3, "dtype": "float32", "values": values}})
    while True:
        for delivery in await consumer.fetch(64, 10.0):
            item = delivery.item
            result = WorkResult(work_item_id=item.work_item_id, request_id=item.request_id,
                                item_index=item.item_index, success=True, result_msgpack=payload)  # fmt: skip
            await transport.publish_result(item.reply_subject, result)
            await delivery.ack()


@pytest.fixture()
async def served_url():
    catalog = load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    config = Config()
    # hypercorn adopts the descriptor (and closes it), so hand it over rather than share it.
    config.bind = [f"fd://{listener.detach()}"]
    config.accesslog = None
    stop = asyncio.Event()
    async with LoopbackTransport() as transport:
        app = build_gateway_app(lambda: catalog, transport, NoWorkers(), GatewaySettings(), router_id="gw-h")
        worker = asyncio.ensure_future(answer_forever(transport))
        server = asyncio.ensure_future(serve(app, config, shutdown_trigger=stop.wait))
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            stop.set()
            await server
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)


@pytest.mark.parametrize(("http1", "http2", "version"), [(True, False, "HTTP/1.1"), (False, True, "HTTP/2")])
async def test_encode_over_http1_and_h2c(served_url: str, http1: bool, http2: bool, version: str) -> None:
    async with httpx.AsyncClient(base_url=served_url, http1=http1, http2=http2) as client:
        await wait_ready(client)
        response = await client.post(ENCODE, json={"items": [{"text": "Hello world"}]})
        assert response.http_version == version
        assert response.status_code == 200
        assert response.json()["items"][0]["dense"]["values"] == [0.5, -1.0, 2.0]
        requests = [client.post(ENCODE, json={"items": [{"text": str(i)}]}) for i in range(20)]
        assert {r.status_code for r in await asyncio.gather(*requests)} == {200}


async def wait_ready(client: httpx.AsyncClient, timeout_s: float = 10.0) -> None:
    """Poll /readyz against a deadline until hypercorn has run the lifespan."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            if (await client.get("/readyz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert asyncio.get_running_loop().time() < deadline, "gateway did not become ready"
        await asyncio.sleep(0.01)
