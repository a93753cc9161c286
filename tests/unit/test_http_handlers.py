"""A framework-free handler mounted in a starlette app by `plain_handler_routes`: every method reaches it, the
path arrives decoded and whole, the query as a mapping, the body bounded; a declined path is a plain 404."""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from sie.http.handlers import plain_handler_app, plain_handler_routes
from sie.placement.api import PATH_PREFIXES, PlacementApi
from support.placement_fakes import BGE, FakeControl


@attrs.frozen
class Reply:
    status: int
    content_type: str
    body: bytes


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, str], bytes]] = []

    async def __call__(self, method: str, path: str, query: Mapping[str, str], body: bytes) -> Reply | None:
        self.calls.append((method, path, dict(query), body))
        if path.endswith("/declined"):
            return None
        return Reply(201, "application/x-test", b"answer")


async def other(request):
    return PlainTextResponse("other")


def client_of(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


async def test_routes_send_every_method_under_each_prefix(recorder: Recorder) -> None:
    app = Starlette(routes=[Route("/other", other), *plain_handler_routes(recorder, ["/v1/things", "/metrics"])])
    async with client_of(app) as client:
        response = await client.post("/v1/things/org%2Fmodel/x?wait=2&wait=3&flag", content=b"{}")
        assert (response.status_code, response.content) == (201, b"answer")
        assert response.headers["content-type"] == "application/x-test"
        assert (await client.delete("/v1/things")).status_code == 201
        assert (await client.get("/metrics")).status_code == 201
        assert (await client.head("/metrics")).status_code == 201
        assert (await client.get("/other")).text == "other"
        declined = await client.get("/v1/things/declined")
        assert (declined.status_code, declined.text) == (404, "not found")
    assert recorder.calls[:4] == [
        ("POST", "/v1/things/org/model/x", {"wait": "3", "flag": ""}, b"{}"),
        ("DELETE", "/v1/things", {}, b""),
        ("GET", "/metrics", {}, b""),
        ("GET", "/metrics", {}, b""),
    ]


async def test_a_body_over_the_cap_is_413_before_the_handler(recorder: Recorder) -> None:
    async with client_of(plain_handler_app(recorder, max_body_bytes=8)) as client:
        response = await client.post("/anything", content=b"x" * 9)
    assert response.status_code == 413
    assert recorder.calls == []


async def test_the_placement_surface_mounts_in_a_starlette_app() -> None:
    control = FakeControl()
    app = Starlette(routes=plain_handler_routes(PlacementApi(control).handle, PATH_PREFIXES))
    async with client_of(app) as client:
        assert (await client.get("/v1/placement")).json()["mode"] == "lpt_packing"
        response = await client.post(f"/v1/placement/models/{BGE}", json={"replicas": 2})
        assert (response.status_code, response.json()["model"]) == (200, BGE)
        assert (await client.get("/v1/placement/policy")).status_code == 405
