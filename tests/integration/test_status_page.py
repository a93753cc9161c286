"""The gateway's operator pages through HTTP on a real socket (seed 000 §14): the status page, `/docs`,
`/openapi.json` (valid OpenAPI 3 listing every served route) and the `/ws/cluster-status` websocket, over each
SIE_HTTP_SERVER, with inference traffic showing up in its snapshots and a draining gateway closing it."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
from openapi_spec_validator import validate
from starlette.routing import Route, WebSocketRoute
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from launcher import free_port
from sie.catalog import load_catalog
from sie.gateway.http.app import GatewaySources, build_gateway_app, serving_state
from sie.gateway.publisher import QueueConsumers
from sie.gateway.status import WorkerSummary
from sie.http.handlers import plain_handler_routes
from sie.http.serving import HttpListener, serve_http
from sie.placement.api import PATH_PREFIXES
from sie.settings import GatewaySettings, LaneSettings
from sie.transport.base import Lane
from sie.transport.loopback import LoopbackTransport
from sie.wire import packb
from sie.wire.queue import WorkResult
from support.gateway_fakes import config_write_routes

REPO = Path(__file__).resolve().parents[2]
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
ENCODE = f"/v1/encode/{MINILM}"
WORKER = WorkerSummary("worker-a", "default", "default", "default", loaded_models=(MINILM,))
SERVERS = ["hypercorn", "uvicorn"]


class OneWorker:
    """A ModelStatusSource: one healthy worker with MiniLM loaded."""

    def status(self, model_id: str) -> tuple[str, None]:
        return ("loaded" if model_id == MINILM else "available"), None

    def workers(self) -> list[WorkerSummary]:
        return [WORKER]

    def residency(self, model_id: str) -> list:
        return []


async def answer_forever(transport: LoopbackTransport) -> None:
    consumer = await transport.consumer(Lane("default", "default", "default"))
    payload = packb({"dense": {"dims": 2, "dtype": "float32", "values": np.array([0.6, 0.8], dtype=np.float32)}})
    while True:
        for delivery in await consumer.fetch(64, 10.0):
            item = delivery.item
            result = WorkResult(work_item_id=item.work_item_id, request_id=item.request_id,
                                item_index=item.item_index, success=True, result_msgpack=payload)  # fmt: skip
            await transport.publish_result(item.reply_subject, result)
            await delivery.ack()


class Served:
    def __init__(self, app, url: str) -> None:
        self.app, self.url = app, url
        self.ws_url = url.replace("http://", "ws://") + "/ws/cluster-status"


@contextlib.asynccontextmanager
async def serving(server_name: str = "hypercorn", extra_routes: Sequence = ()) -> AsyncIterator[Served]:
    catalog = load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")
    listener = HttpListener("127.0.0.1", free_port(), grace_s=5.0, server=server_name)
    stop = asyncio.Event()
    async with LoopbackTransport() as transport:
        sources = GatewaySources(lambda: catalog, transport, QueueConsumers(transport), OneWorker())
        app = build_gateway_app(sources, GatewaySettings(), LaneSettings(), "gw-s", extra_routes=extra_routes)
        worker = asyncio.ensure_future(answer_forever(transport))
        server = asyncio.ensure_future(serve_http(app, listener, stop))
        try:
            url = f"http://127.0.0.1:{listener.port}"
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                for _ in range(200):  # the listener binds in the background
                    with contextlib.suppress(httpx.TransportError):
                        await client.get("/healthz")
                        break
                    await asyncio.sleep(0.05)
            yield Served(app, url)
        finally:
            stop.set()
            await server
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)


async def next_snapshot(socket: ClientConnection) -> dict:
    return orjson.loads(await asyncio.wait_for(socket.recv(), timeout=10))


# --- the pages ----------------------------------------------------------------------------------------------


async def test_status_page_is_one_self_contained_html_file() -> None:
    async with serving() as served, httpx.AsyncClient(base_url=served.url) as client:
        response = await client.get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = response.text
    assert "/ws/cluster-status" in page and "<script>" in page
    # Nothing from elsewhere: no external scripts, styles or images, and a policy that would block them.
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)
    assert not re.search(r"(src|href)=\"https?://", page)
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy


async def test_docs_page_draws_the_openapi_json() -> None:
    async with serving() as served, httpx.AsyncClient(base_url=served.url) as client:
        response = await client.get("/docs")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assert 'fetch("/openapi.json")' in response.text
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", response.text)


def openapi_path(template: str) -> str:
    """`/v1/encode/{model:path}` -> `/v1/encode/{model}`."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", template)


def assert_lists_every_route(document: dict, routes: Sequence) -> None:
    """Every served path is described, with exactly the methods its routes (one or several per path) serve."""
    paths = document["paths"]
    served: dict[str, set[str]] = {}
    for route in routes:
        if route.path.endswith("/{rest:path}"):  # everything under a prefix (the placement surface, `/metrics`)
            assert route.path.removesuffix("/{rest:path}") in paths, route.path
            continue
        path = openapi_path(route.path)
        assert path in paths, path
        if isinstance(route, WebSocketRoute):
            assert set(paths[path]) == {"get"}
        elif isinstance(route, Route) and route.methods is not None:
            served.setdefault(path, set()).update(method.lower() for method in route.methods)
    for path, methods in served.items():
        assert methods - {"head"} == set(paths[path]), path


@pytest.mark.parametrize("with_placement", [False, True], ids=["gateway", "all"])
async def test_openapi_json_is_valid_openapi_3_listing_every_served_route(with_placement: bool) -> None:
    async def no_placement(method: str, path: str, query: dict, body: bytes) -> None:
        return None

    # `all` also serves the config writes of its in-process config service.
    extra = [*plain_handler_routes(no_placement, PATH_PREFIXES), *config_write_routes()] if with_placement else []
    async with serving(extra_routes=extra) as served, httpx.AsyncClient(base_url=served.url) as client:
        response = await client.get("/openapi.json")
        routes = served.app.routes
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    document = response.json()
    validate(document)
    assert document["openapi"].startswith("3.")
    assert_lists_every_route(document, routes)
    # The gateway role does not serve the placement surface nor config writes, so it does not describe them.
    assert ("/v1/placement/policy" in document["paths"]) is with_placement
    assert ("post" in document["paths"]["/v1/configs/models"]) is with_placement
    assert set(document["paths"]["/v1/configs/models"]) >= {"get"}
    for path in ("/", "/docs", "/openapi.json", "/ws/cluster-status", "/v1/encode/{model}", "/v1/embeddings"):
        assert path in document["paths"]


# --- the websocket ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("server_name", SERVERS)
async def test_websocket_pushes_cluster_status_with_traffic(server_name: str) -> None:
    async with serving(server_name) as served, connect(served.ws_url) as socket:
        first = await next_snapshot(socket)
        assert set(first) >= {"timestamp", "cluster", "workers", "models", "queue", "traffic"}
        assert first["workers"] == [WORKER.to_dict()]
        assert {"name": MINILM, "state": "loaded", "worker_count": 1} in first["models"]
        assert first["cluster"]["worker_count"] == 1 and first["cluster"]["models_loaded"] == 1
        assert first["queue"] == {"pools": {"default": 0}, "waiting_requests": 0}
        assert len(first["traffic"]["requests"]) == 300 and sum(first["traffic"]["requests"]) == 0

        async with httpx.AsyncClient(base_url=served.url, timeout=10) as client:
            answers = [await client.post(ENCODE, json={"items": [{"text": "hi"}]}) for _ in range(3)]
            missing = await client.post("/v1/encode/acme/missing", json={"items": [{"text": "hi"}]})
        assert [answer.status_code for answer in answers] == [200] * 3 and missing.status_code == 404

        # The newest bucket in a snapshot is the last whole second, so the requests show within two pushes.
        for _ in range(5):
            traffic = (await next_snapshot(socket))["traffic"]
            if sum(traffic["requests"]) == 4:
                break
        assert sum(traffic["requests"]) == 4 and sum(traffic["failed"]) == 1
        assert traffic["requests_per_s"] > 0 and max(traffic["latency_max_ms"]) > 0


async def test_probes_and_pages_are_not_counted_as_traffic() -> None:
    async with serving() as served:
        async with httpx.AsyncClient(base_url=served.url, timeout=10) as client:
            for path in ("/", "/healthz", "/health", "/v1/models", "/openapi.json"):
                assert (await client.get(path)).status_code == 200
        async with connect(served.ws_url) as socket:
            await next_snapshot(socket)
            traffic = (await next_snapshot(socket))["traffic"]
    assert sum(traffic["requests"]) == 0


@pytest.mark.parametrize("server_name", SERVERS)
async def test_a_draining_gateway_closes_the_websocket_as_going_away(server_name: str) -> None:
    async with serving(server_name) as served, connect(served.ws_url) as socket:
        await next_snapshot(socket)
        serving_state(served.app).begin_shutdown()
        with pytest.raises(ConnectionClosed) as closed:
            for _ in range(5):
                await next_snapshot(socket)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
