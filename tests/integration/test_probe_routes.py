"""A real ProbeServer on a free port serving the placement surface beside its probes: GET and POST over a real
socket, bodies by Content-Length, percent-decoded paths, refusals before the handler, a failing handler, and an
exit that does not wait for a handler still running."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from sie.http.plain import first_answer
from sie.placement.api import PlacementApi
from sie.placement.metrics import PlacementCollector
from sie.placement.policy import ModelOverride
from sie.sidecar.pod.probes import ProbeServer
from sie.telemetry.exposition import MetricsEndpoint
from sie.telemetry.metrics import Telemetry
from support.placement_fakes import BGE, FakeControl
from support.polling import eventually

HOST = "127.0.0.1"


@pytest.fixture()
async def client():
    async with httpx.AsyncClient(trust_env=False, timeout=5.0) as client:
        yield client


@pytest.fixture()
def control() -> FakeControl:
    return FakeControl()


@pytest.fixture()
async def base(control: FakeControl):
    telemetry = Telemetry()  # `/metrics` as the sidecar serves it beside placement: placement's series included
    telemetry.register(PlacementCollector(control.snapshot))
    routes = first_answer(MetricsEndpoint(telemetry).handle, PlacementApi(control).handle)
    async with ProbeServer(lambda: True, 0, HOST, routes=routes, max_body_bytes=4096) as probes:
        yield f"http://{HOST}:{probes.port}"


async def test_get_placement_and_metrics(client: httpx.AsyncClient, base: str) -> None:
    placement = await client.get(f"{base}/v1/placement")
    assert placement.status_code == 200
    assert placement.headers["content-type"] == "application/json"
    assert placement.json()["models"][0]["model"] == BGE
    metrics = await client.get(f"{base}/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "sie_placement_worker_ready" in metrics.text
    head = await client.head(f"{base}/v1/placement")
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) == len(placement.content)


async def test_probes_answer_as_before(client: httpx.AsyncClient, base: str) -> None:
    live = await client.get(f"{base}/healthz")
    assert (live.status_code, live.text, live.headers["content-type"]) == (200, "ok", "text/plain; charset=utf-8")
    assert (await client.get(f"{base}/readyz")).status_code == 200
    assert (await client.post(f"{base}/readyz")).status_code == 405
    other = await client.get(f"{base}/elsewhere")
    assert (other.status_code, other.text) == (404, "not found")


async def test_post_with_a_body(client: httpx.AsyncClient, base: str, control: FakeControl) -> None:
    response = await client.post(f"{base}/v1/placement/models/{BGE}", json={"replicas": 2, "fill_mode": "spread"})
    assert response.status_code == 200, response.text
    assert response.json()["override"] == {"replicas": 2, "fill_mode": "spread", "fill_factor": None}
    encoded = await client.post(f"{base}/v1/placement/models/org%2Fother", json={"replicas": "all"})
    assert encoded.json()["model"] == "org/other"
    assert control.policy.models == {BGE: ModelOverride(2, "spread"), "org/other": ModelOverride("all")}
    policy = await client.post(f"{base}/v1/placement/policy", json={"hysteresis": 0.2})
    assert (policy.status_code, policy.json()["hysteresis"]) == (200, 0.2)
    refused = await client.post(f"{base}/v1/placement/policy", content=b"[1]")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "bad_request"


async def test_repack_with_a_query(client: httpx.AsyncClient, base: str, control: FakeControl) -> None:
    response = await client.post(f"{base}/v1/placement/repack", params={"wait": "1.5"})
    assert (response.status_code, response.json()["trigger"]) == (200, "manual")
    assert (await client.post(f"{base}/v1/placement/repack?wait=never")).status_code == 400
    assert control.waits == [1.5]


async def test_bodies_are_bounded_and_need_a_length(client: httpx.AsyncClient, base: str) -> None:
    too_large = await client.post(f"{base}/v1/placement/policy", content=b"x" * 5000)
    assert (too_large.status_code, too_large.text) == (413, "the body is over the 4096 byte limit")

    async def chunks():
        yield b'{"hysteresis": 0.1}'

    chunked = await client.post(f"{base}/v1/placement/policy", content=chunks())
    assert chunked.status_code == 411


async def test_a_failing_handler_answers_500_and_the_probes_keep_serving(client: httpx.AsyncClient) -> None:
    async def broken(method, path, query, body):
        raise RuntimeError("bug in the handler")

    async with ProbeServer(lambda: True, 0, HOST, routes=broken) as probes:
        base = f"http://{HOST}:{probes.port}"
        assert (await client.get(f"{base}/v1/placement")).status_code == 500
        assert (await client.get(f"{base}/healthz")).status_code == 200


async def test_exit_does_not_wait_for_a_running_handler(client: httpx.AsyncClient, control: FakeControl) -> None:
    control.repack_gate = asyncio.Event()  # never opened: the repack waits until the server goes
    async with ProbeServer(lambda: True, 0, HOST, routes=PlacementApi(control).handle) as probes:
        pending = asyncio.create_task(client.post(f"http://{HOST}:{probes.port}/v1/placement/repack?wait=300"))
        await eventually(lambda: control.waits == [300.0], what="the repack to start")
    with pytest.raises(httpx.HTTPError):
        await pending
