"""Gateway auth (seed 000 §13; contracts Part B §1.10) through HTTP against the real gateway app: the matrix of
route × token kind × SIE_AUTH_MODE × SIE_AUTH_EXEMPT_OPERATIONAL, admin routes with no admin token, the websocket
handshake, and tokens rotated through SIE_AUTH_TOKENS_FILE without a restart. The app runs over the loopback
transport with the placement surface beside it, as in `--role all`. `sie run` refusing auth settings it cannot
serve is in tests/unit/test_cli.py; real servers and clients in tests/e2e/test_gateway_auth.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
import pytest
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from launcher import free_port
from sie.catalog import Catalog
from sie.control.auth import AccessPolicy
from sie.gateway.dead_letters import DeadLetterQueue
from sie.gateway.http.app import GatewaySources, build_gateway_app
from sie.gateway.http.auth import GatewayAuth
from sie.gateway.publisher import QueueConsumers
from sie.http.handlers import plain_handler_routes
from sie.http.serving import HttpListener, serve_http
from sie.placement.api import PATH_PREFIXES, PlacementApi
from sie.settings import GatewaySettings, LaneSettings, StreamSettings
from sie.transport.loopback import LoopbackTransport
from support.gateway_fakes import NoWorkers, config_write_routes
from support.placement_fakes import FakeControl
from support.polling import eventually

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
INFERENCE_TOKENS = ("infer-a", "infer-b")
ADMIN = "admin-x"
TOKENS = {"none": None, "inference": "infer-b", "admin": ADMIN, "wrong": "nope"}
ENCODE_BODY = {"items": [{"text": "Hello world"}]}

# (method, path, JSON body, kind): every kind of route the gateway and `--role all` serve.
ROUTES = [
    ("GET", "/healthz", None, "probe"),
    ("GET", "/readyz", None, "probe"),
    ("GET", "/", None, "operational"),
    ("GET", "/health", None, "operational"),
    ("GET", "/metrics", None, "operational"),
    ("GET", "/docs", None, "operational"),
    ("POST", f"/v1/encode/{MINILM}", ENCODE_BODY, "inference"),
    ("POST", "/v1/embeddings", {"model": MINILM, "input": "Hello world"}, "inference"),
    ("POST", "/v1/responses", {"model": MINILM, "input": "Hello world"}, "inference"),
    ("POST", f"/{MINILM}/embed", {"inputs": "Hello world"}, "inference"),
    ("POST", "/embed", {"inputs": "Hello world"}, "inference"),
    ("POST", f"/{MINILM}/tokenize", {"inputs": "Hello world"}, "inference"),
    ("POST", "/rerank", {"query": "Hello", "texts": ["world"]}, "inference"),
    ("POST", "/v2/rerank", {"model": MINILM, "query": "Hello", "documents": ["world"]}, "inference"),
    ("POST", "/api/embed", {"model": MINILM, "input": "Hello world"}, "inference"),
    ("POST", f"/{MINILM}/v1/embeddings", {"model": "tei", "input": "Hello world"}, "inference"),
    ("POST", f"/{MINILM}/embeddings", {"model": "tei", "input": "Hello world"}, "inference"),
    (
        "POST",
        f"/v2/models/{MINILM}/infer",
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["Hello"]}]},
        "inference",
    ),
    ("GET", "/v1/models", None, "inference"),
    ("GET", "/v1/configs/models", None, "inference"),
    ("POST", "/v1/configs/resolve", {"model": MINILM}, "inference"),
    ("GET", "/v1/placement", None, "inference"),
    ("GET", "/v1/no-such-route", None, "inference"),
    ("GET", "/v1/dlq", None, "admin"),
    ("POST", "/v1/dlq/purge", None, "admin"),
    ("POST", "/v1/configs/models", None, "admin"),
    ("DELETE", "/v1/pools/p1", None, "admin"),
    ("POST", "/v1/placement/policy", {"hysteresis": 0.15}, "admin"),
]


# (a refusal comes before the body is read: `/rerank`, TEI's or Jina's by its body, answers in TEI's envelope)
DIALECT_ENVELOPES = {f"/{MINILM}/embed": {"error", "error_type"}, "/embed": {"error", "error_type"},
                     f"/{MINILM}/tokenize": {"error", "error_type"},
                     "/v2/rerank": {"message"}, "/rerank": {"error", "error_type"}, "/api/embed": {"error"},
                     f"/v2/models/{MINILM}/infer": {"error"}}  # fmt: skip


def refusal(kind: str, mode: str, exempt: bool, token: str) -> int | None:
    """The seed's rules: the status a request is refused with, or None when the route answers it."""
    if kind == "probe":
        return None
    if kind == "admin":  # SIE_ADMIN_TOKEN is set in the matrix, so every mode checks it
        return 401 if token == "none" else (None if token == "admin" else 403)
    if mode == "none" or (kind == "operational" and exempt):
        return None
    return 401 if token in ("none", "wrong") else None


@asynccontextmanager
async def gateway(
    catalog: Catalog, auth: GatewayAuth, admin_token: str | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway app, with its dead letters, and the placement surface and config writes of `--role all` (the
    latter checking `admin_token` as the in-process config service does), driven over HTTP."""
    async with AsyncExitStack() as stack:
        transport = await stack.enter_async_context(LoopbackTransport(StreamSettings()))
        dead_letters = await stack.enter_async_context(DeadLetterQueue(transport, 5.0))
        sources = GatewaySources(lambda: catalog, transport, QueueConsumers(transport), NoWorkers(),
                                 dead_letters=dead_letters, auth=auth)  # fmt: skip
        placement = plain_handler_routes(PlacementApi(FakeControl()).handle, PATH_PREFIXES)
        policy = AccessPolicy(admin_token=admin_token)  # the in-process config service's, from SIE_ADMIN_TOKEN
        extra = [*placement, *config_write_routes(policy)]
        app = build_gateway_app(sources, GatewaySettings(), LaneSettings(), "gw-auth", extra_routes=extra)
        await stack.enter_async_context(app.router.lifespan_context(app))
        yield await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
        )


async def call(client: httpx.AsyncClient, method: str, path: str, body: object, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return await client.request(method, path, json=body, headers=headers)


def check_refusal(response: httpx.Response, status: int, path: str) -> None:
    assert response.status_code == status, response.text
    openai_path = path == "/v1/responses" or (path.endswith("/embeddings") and path != "/api/embeddings")
    if openai_path:  # OpenAI's envelope (TEI's OpenAI routes too)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key" and error["message"]
    elif path in DIALECT_ENVELOPES:  # each dialect's own, the code in the header
        assert set(response.json()) == DIALECT_ENVELOPES[path]
        assert response.headers["x-sie-error-code"] == ("UNAUTHORIZED" if status == 401 else "FORBIDDEN")
    else:
        detail = response.json()["detail"]
        assert detail["code"] == ("UNAUTHORIZED" if status == 401 else "FORBIDDEN") and detail["message"]
    if status == 401:
        assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("mode", ["none", "token"])
@pytest.mark.parametrize("exempt", [False, True], ids=["exempt-off", "exempt-on"])
@pytest.mark.parametrize(("method", "path", "body", "kind"), ROUTES, ids=[f"{r[0]} {r[1]}" for r in ROUTES])
async def test_matrix(
    baseline_catalog: Catalog, mode: str, exempt: bool, method: str, path: str, body: object, kind: str
) -> None:
    """Each token kind on each route: refused as the rules say, else answered exactly as an open gateway answers."""
    auth = GatewayAuth(mode=mode, tokens=INFERENCE_TOKENS, admin_token=ADMIN, exempt_operational=exempt)
    async with gateway(baseline_catalog, GatewayAuth()) as open_gateway:
        answered = await call(open_gateway, method, path, body, None)
    assert answered.status_code not in (401, 403)
    async with gateway(baseline_catalog, auth, ADMIN) as client:
        for token_kind, token in TOKENS.items():
            response = await call(client, method, path, body, token)
            status = refusal(kind, mode, exempt, token_kind)
            if status is None:
                assert response.status_code == answered.status_code, (token_kind, response.text)
            else:
                check_refusal(response, status, path)


async def test_a_raw_token_without_the_bearer_scheme_is_accepted(baseline_catalog: Catalog) -> None:
    async with gateway(baseline_catalog, GatewayAuth(mode="token", tokens=INFERENCE_TOKENS)) as client:
        assert (await client.get("/v1/models", headers={"Authorization": "infer-a"})).status_code == 200
        assert (await client.get("/v1/models", headers={"Authorization": "Basic aW5mZXI="})).status_code == 401


async def test_admin_routes_are_closed_in_token_mode_without_an_admin_token(baseline_catalog: Catalog) -> None:
    async with gateway(baseline_catalog, GatewayAuth(mode="token", tokens=INFERENCE_TOKENS)) as client:
        for token in (None, "infer-a"):
            refused = await call(client, "GET", "/v1/dlq", None, token)
            check_refusal(refused, 403, "/v1/dlq")
            assert "SIE_ADMIN_TOKEN is not set" in refused.json()["detail"]["message"]
        assert (await call(client, "GET", "/v1/models", None, "infer-a")).status_code == 200


async def test_without_any_token_mode_none_is_open_even_on_admin_routes(baseline_catalog: Catalog) -> None:
    async with gateway(baseline_catalog, GatewayAuth()) as client:
        assert (await client.get("/v1/dlq")).status_code == 200
        assert (await client.post("/v1/placement/policy", json={"hysteresis": 0.15})).status_code == 200


def echo_route() -> WebSocketRoute:
    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(await websocket.receive_text())
        await websocket.close()

    return WebSocketRoute("/ws/echo", echo)


@asynccontextmanager
async def served(catalog: Catalog, auth: GatewayAuth, server_name: str) -> AsyncIterator[str]:
    """The gateway app, with a websocket echo under /ws/, behind a real HTTP server; yields its ws:// base URL."""
    listener = HttpListener("127.0.0.1", free_port(), grace_s=5.0, server=server_name)
    stop = asyncio.Event()
    async with LoopbackTransport(StreamSettings()) as transport:
        sources = GatewaySources(lambda: catalog, transport, QueueConsumers(transport), NoWorkers(), auth=auth)
        app = build_gateway_app(sources, GatewaySettings(), LaneSettings(), "gw-ws", extra_routes=[echo_route()])
        server = asyncio.ensure_future(serve_http(app, listener, stop))
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{listener.port}") as http:

                async def up() -> bool:
                    with contextlib.suppress(httpx.TransportError):
                        return (await http.get("/healthz")).status_code == 200
                    return False

                await eventually(up, timeout_s=10.0, interval_s=0.05, what="the server")
            yield f"ws://127.0.0.1:{listener.port}"
        finally:
            stop.set()
            await server


@pytest.mark.parametrize("server_name", ["hypercorn", "uvicorn"])
@pytest.mark.parametrize("exempt", [False, True], ids=["exempt-off", "exempt-on"])
async def test_websocket_handshake(baseline_catalog: Catalog, server_name: str, exempt: bool) -> None:
    """A websocket under /ws/ is operational: without a valid token its handshake is refused (403) unless exempt."""
    auth = GatewayAuth(mode="token", tokens=INFERENCE_TOKENS, exempt_operational=exempt)
    async with served(baseline_catalog, auth, server_name) as base:
        async with connect(f"{base}/ws/echo", additional_headers={"Authorization": "Bearer infer-a"}) as socket:
            await socket.send("hi")
            assert await socket.recv() == "hi"
        for headers in ({}, {"Authorization": "Bearer nope"}):
            if exempt:
                async with connect(f"{base}/ws/echo", additional_headers=headers) as socket:
                    await socket.send("open")
                    assert await socket.recv() == "open"
            else:
                with pytest.raises(InvalidStatus) as refused:
                    await connect(f"{base}/ws/echo", additional_headers=headers)
                assert refused.value.response.status_code == 403


async def test_tokens_rotate_through_the_tokens_file_without_a_restart(
    baseline_catalog: Catalog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text("# inference tokens\nfirst\n\n")
    async with (
        GatewayAuth(mode="token", tokens=("from-env",), tokens_file=tokens_file) as auth,
        gateway(baseline_catalog, auth) as client,
    ):

        async def status(token: str) -> int:
            return (await call(client, "GET", "/v1/models", None, token)).status_code

        assert (await status("first"), await status("from-env"), await status("second")) == (200, 200, 401)
        replacement = tmp_path / "tokens.new"
        replacement.write_text("second\n")
        replacement.replace(tokens_file)  # how a mounted secret changes: a new file in the old one's place

        async def rotated() -> bool:
            return (await status("second"), await status("first")) == (200, 401)

        await eventually(rotated, timeout_s=15.0, interval_s=0.1, what="the rotated token")
        assert await status("from-env") == 200
        tokens_file.unlink()  # a vanished file keeps its last tokens: it must neither open nor lock the gateway
        noticed = f"re-reading {tokens_file} failed"
        await eventually(lambda: noticed in caplog.text, timeout_s=15.0, interval_s=0.1, what="the vanished file")
        assert (await status("second"), await status("nope")) == (200, 401)
