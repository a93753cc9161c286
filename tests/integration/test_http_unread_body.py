"""A client that answers are sent to before its request body arrived never loses its next request: over real
hypercorn and uvicorn, an answer given before the body was read either says `Connection: close` (and the server
closes) or the connection goes on to answer the next request. Found by tests/fuzz: hypercorn dropped such
connections without saying so, and the next request on them got no answer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from launcher import free_port
from sie.catalog import load_catalog
from sie.gateway.http.app import GatewaySources, build_gateway_app
from sie.gateway.publisher import QueueConsumers
from sie.http.serving import HttpListener, serve_http
from sie.settings import GatewaySettings, LaneSettings
from sie.transport.loopback import LoopbackTransport
from support.gateway_fakes import NoWorkers
from support.polling import eventually

REPO = Path(__file__).resolve().parents[2]


@contextlib.asynccontextmanager
async def serving(server_name: str) -> AsyncIterator[int]:
    """The gateway app on a real server; yields its port once it answers."""
    catalog = load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")
    listener = HttpListener("127.0.0.1", free_port(), grace_s=5.0, server=server_name)
    stop = asyncio.Event()
    async with LoopbackTransport() as transport:
        sources = GatewaySources(lambda: catalog, transport, QueueConsumers(transport), NoWorkers())
        app = build_gateway_app(sources, GatewaySettings(), LaneSettings(), "gw-unread")
        server = asyncio.ensure_future(serve_http(app, listener, stop))
        try:
            await eventually(lambda: listening(listener.port), timeout_s=10.0, what="the server to listen")
            yield listener.port
        finally:
            stop.set()
            await server


async def listening(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One HTTP/1.1 answer with a Content-Length: its head (lower-cased) and body."""
    head = (await reader.readuntil(b"\r\n\r\n")).lower()
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.startswith(b"content-length:"))
    return head, await reader.readexactly(length)


@pytest.mark.parametrize("server_name", ["hypercorn", "uvicorn"])
async def test_an_answer_before_the_body_never_costs_the_next_request(server_name: str) -> None:
    async with serving(server_name) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            # The head alone: the route refuses the method (405) without reading the body, which comes later.
            writer.write(b"PUT /v1/models HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n")
            head, _ = await read_answer(reader)
            assert head.startswith(b"http/1.1 405")
            writer.write(b"hello" + b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            await writer.drain()
            if b"connection: close" in head:
                assert await reader.read() == b""  # closed, as it said
            else:
                second, body = await read_answer(reader)
                assert second.startswith(b"http/1.1 200") and body == b"ok"
        finally:
            writer.close()


async def test_requests_without_a_body_keep_the_connection() -> None:
    async with serving("hypercorn") as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(2):
                writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                head, body = await read_answer(reader)
                assert head.startswith(b"http/1.1 200") and b"connection: close" not in head and body == b"ok"
        finally:
            writer.close()
