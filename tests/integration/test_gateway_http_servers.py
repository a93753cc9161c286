"""The gateway app served on a real socket by each SIE_HTTP_SERVER, over HTTP/1.1 and h2c (HTTP/2 prior knowledge:
hypercorn's own, or handed from uvicorn's bind to hypercorn's HTTP/2 stack); stopping the server lets an in-flight
request finish on either protocol."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvloop

from launcher import free_port
from sie.catalog import load_catalog
from sie.gateway.http.app import GatewaySources, build_gateway_app
from sie.gateway.publisher import QueueConsumers
from sie.http.h2c import asks_for_h2c
from sie.http.serving import HttpListener, serve_http
from sie.settings import GatewaySettings, LaneSettings
from sie.transport.base import Lane
from sie.transport.loopback import LoopbackTransport
from sie.wire import packb
from sie.wire.queue import WorkResult
from support.gateway_fakes import NoWorkers
from support.polling import eventually

REPO = Path(__file__).resolve().parents[2]
ENCODE = "/v1/encode/sentence-transformers/all-MiniLM-L6-v2"


def on_uvloop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test on uvloop, the loop the roles run on (SIE_EVENT_LOOP=auto): its transports are not
    subclasses of asyncio's, which the server code must not assume."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(test(*args, **kwargs))

    return run


async def answer_forever(transport: LoopbackTransport, delay_s: float = 0.0) -> None:
    consumer = await transport.consumer(Lane("default", "default", "default"))
    values = np.array([0.5, -1.0, 2.0], dtype=np.float32)
    payload = packb({"dense": {"dims": 3, "dtype": "float32", "values": values}})
    while True:
        for delivery in await consumer.fetch(64, 10.0):
            await asyncio.sleep(delay_s)
            item = delivery.item
            result = WorkResult(work_item_id=item.work_item_id, request_id=item.request_id,
                                item_index=item.item_index, success=True, result_msgpack=payload)  # fmt: skip
            await transport.publish_result(item.reply_subject, result)
            await delivery.ack()


class Served:
    """A gateway app behind a real HTTP server; `stop` starts the server's graceful shutdown."""

    def __init__(self, url: str, stop: asyncio.Event, server: asyncio.Future) -> None:
        self.url, self.stop, self.server = url, stop, server


@contextlib.asynccontextmanager
async def serving(server_name: str, answer_delay_s: float = 0.0) -> AsyncIterator[Served]:
    catalog = load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")
    listener = HttpListener("127.0.0.1", free_port(), grace_s=5.0, server=server_name)
    stop = asyncio.Event()
    async with LoopbackTransport() as transport:
        sources = GatewaySources(lambda: catalog, transport, QueueConsumers(transport), NoWorkers())
        app = build_gateway_app(sources, GatewaySettings(), LaneSettings(), "gw-h")
        worker = asyncio.ensure_future(answer_forever(transport, answer_delay_s))
        server = asyncio.ensure_future(serve_http(app, listener, stop))
        try:
            yield Served(f"http://127.0.0.1:{listener.port}", stop, server)
        finally:
            stop.set()
            await server
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)


@pytest.mark.parametrize(
    ("server_name", "http1", "http2", "version"),
    [
        ("hypercorn", True, False, "HTTP/1.1"),
        ("hypercorn", False, True, "HTTP/2"),
        ("uvicorn", True, False, "HTTP/1.1"),
        ("uvicorn", False, True, "HTTP/2"),
    ],
)
@on_uvloop
async def test_encode_over_each_server_and_protocol(server_name: str, http1: bool, http2: bool, version: str) -> None:
    async with (
        serving(server_name) as served,
        httpx.AsyncClient(base_url=served.url, http1=http1, http2=http2) as client,
    ):
        await wait_ready(client)
        response = await client.post(ENCODE, json={"items": [{"text": "Hello world"}]})
        assert response.http_version == version
        assert response.status_code == 200
        assert response.json()["items"][0]["dense"]["values"] == [0.5, -1.0, 2.0]
        requests = [client.post(ENCODE, json={"items": [{"text": str(i)}]}) for i in range(20)]
        assert {r.status_code for r in await asyncio.gather(*requests)} == {200}


@pytest.mark.parametrize("server_name", ["hypercorn", "uvicorn"])
@pytest.mark.parametrize("http2", [False, True], ids=["http1", "h2c"])
@on_uvloop
async def test_stopping_the_server_finishes_the_request_in_flight(server_name: str, http2: bool) -> None:
    async with (
        serving(server_name, answer_delay_s=0.5) as served,
        httpx.AsyncClient(base_url=served.url, http1=not http2, http2=http2) as client,
    ):
        await wait_ready(client)
        in_flight = asyncio.ensure_future(client.post(ENCODE, json={"items": [{"text": "slow"}]}))
        await asyncio.sleep(0.2)
        served.stop.set()
        response = await in_flight
        assert response.status_code == 200
        assert response.json()["items"][0]["dense"]["values"] == [0.5, -1.0, 2.0]
        await asyncio.wait_for(served.server, 10.0)
        with pytest.raises(httpx.TransportError):
            await client.get("/healthz")


@on_uvloop
async def test_uvicorn_reads_a_preface_sent_in_pieces_and_leaves_other_openings_to_http1() -> None:
    """The first bytes decide the protocol however they arrive; an HTTP/1.1 request whose method shares the preface's
    first letter (POST, PUT) is served over HTTP/1.1."""
    async with serving("uvicorn") as served, httpx.AsyncClient(base_url=served.url) as client:
        await wait_ready(client)
        port = int(served.url.rsplit(":", 1)[1])
        # HTTP/2 by prior knowledge, the preface in three writes: the server answers with its SETTINGS frame.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for piece in (b"P", b"RI * HTTP/2.0\r\n", b"\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.05)
        frame = await asyncio.wait_for(reader.readexactly(9), 5.0)
        assert frame[3] == 0x04  # SETTINGS
        writer.close()
        # HTTP/1.1 starting with the same letter, sent byte by byte at first.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = b'{"items": [{"text": "piecewise"}]}'
        head = f"POST {ENCODE} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        request = head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body
        for byte in request[:3]:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write(request[3:])
        status = await asyncio.wait_for(reader.readline(), 5.0)
        assert status.startswith(b"HTTP/1.1 200")
        writer.close()


@pytest.mark.parametrize("server_name", ["hypercorn", "uvicorn"])
@on_uvloop
async def test_an_upgrade_to_h2c_is_honoured_and_a_request_body_beside_it_kept(server_name: str) -> None:
    """`curl --http2` on http:// asks to upgrade its first request: without a body the answer comes over HTTP/2
    (101, then the response on stream 1); with a body, over HTTP/1.1 — and the body is read, not dropped."""
    upgrade = {"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c", "HTTP2-Settings": "AAMAAABkAARAAAAAAAIAAAAA"}
    async with serving(server_name) as served:
        async with httpx.AsyncClient(base_url=served.url) as client:
            await wait_ready(client)
        reader, writer = await asyncio.open_connection("127.0.0.1", int(served.url.rsplit(":", 1)[1]))
        head = "GET /healthz HTTP/1.1\r\nHost: gw\r\n" + "".join(f"{k}: {v}\r\n" for k, v in upgrade.items())
        writer.write(head.encode() + b"\r\n")
        assert (await asyncio.wait_for(reader.readline(), 5.0)).startswith(b"HTTP/1.1 101")
        writer.close()
        async with httpx.AsyncClient(base_url=served.url) as fresh:  # the upgrade rides a connection's first request
            with_body = await fresh.post(ENCODE, json={"items": [{"text": "upgrade"}]}, headers=upgrade)
        assert (with_body.http_version, with_body.status_code) == ("HTTP/1.1", 200)
        assert with_body.json()["items"][0]["dense"]["values"] == [0.5, -1.0, 2.0]


def test_only_an_upgrade_header_naming_h2c_asks_for_it() -> None:
    assert asks_for_h2c(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUPGRADE:  websocket , H2C")
    assert not asks_for_h2c(b"GET /h2c HTTP/1.1\r\nHost: h2c\r\nUpgrade: websocket\r\nX-Note: h2c")
    assert not asks_for_h2c(b"GET / HTTP/1.1\r\nHost: a")


@on_uvloop
async def test_uvicorn_closes_a_silent_connection_when_it_stops() -> None:
    async with serving("uvicorn") as served, httpx.AsyncClient(base_url=served.url) as client:
        await wait_ready(client)
        reader, writer = await asyncio.open_connection("127.0.0.1", int(served.url.rsplit(":", 1)[1]))
        served.stop.set()
        await asyncio.wait_for(served.server, 10.0)
        assert await asyncio.wait_for(reader.read(), 5.0) == b""
        writer.close()


def test_an_unknown_server_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown HTTP server 'gunicorn'"):
        asyncio.run(serve_http(lambda *args: None, HttpListener("127.0.0.1", 0, 1.0, "gunicorn"), asyncio.Event()))


async def wait_ready(client: httpx.AsyncClient) -> None:
    """Poll /readyz until hypercorn has run the lifespan."""

    async def ready() -> bool:
        try:
            return (await client.get("/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    await eventually(ready, timeout_s=10.0, interval_s=0.01, what="the gateway to become ready")


@pytest.mark.parametrize("server_name", ["hypercorn", "uvicorn"])
@on_uvloop
async def test_a_client_leaving_mid_upload_is_an_info_line_not_an_error(
    server_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with serving(server_name) as served, httpx.AsyncClient(base_url=served.url) as client:
        await wait_ready(client)
        _, writer = await asyncio.open_connection("127.0.0.1", int(served.url.rsplit(":", 1)[1]))
        head = f"POST {ENCODE} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
        writer.write(head.encode() + b'{"items": [{"text": "' + b"a" * 20_000)
        await writer.drain()
        await asyncio.sleep(0.2)  # the handler is reading the body now
        writer.close()
        await eventually(lambda: "client disconnected after sending" in caplog.text, timeout_s=10.0)
        # The gateway still serves the next request.
        assert (await client.post(ENCODE, json={"items": [{"text": "after"}]})).status_code == 200
    leaving = [record for record in caplog.records if "client disconnected after sending" in record.getMessage()]
    assert [record.levelno for record in leaving] == [logging.INFO]
    assert "of 100000 body bytes" in leaving[0].getMessage()
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR], caplog.text
