"""Pools through the gateway's HTTP surface over the loopback transport (seed 000 §2, §14, §16.3): the pools API,
named pools failing closed, logical pools publishing on their queue pool with `admission_pool`, pending demand and
warm floors on `/v1/scaling/lanes` and `/metrics`, and lane in-flight backpressure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
import pytest

from sie.catalog import Catalog, load_catalog
from sie.gateway.http.app import GatewaySources, build_gateway_app
from sie.gateway.pools import PoolDirectory
from sie.gateway.publisher import QueueConsumers
from sie.gateway.scaling import LaneSignals
from sie.gateway.status import LastError, WorkerSummary
from sie.pools import DemandTracker, MemoryPoolStore
from sie.settings import GatewaySettings, LaneSettings, PoolSettings
from sie.telemetry.gateway import GatewayMetrics
from sie.telemetry.metrics import ModelLabels, Telemetry
from sie.transport.base import Lane, LaneConsumer
from sie.transport.loopback import LoopbackTransport
from sie.wire import packb
from sie.wire.queue import WorkItem, WorkResult
from support.polling import eventually

REPO = Path(__file__).resolve().parents[2]
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
ENCODE = f"/v1/encode/{MINILM}"
TEXT = {"items": [{"text": "Hello world"}]}
LANE = Lane("default", "default", "default")


class Workers:
    """A ModelStatusSource with one healthy worker on the default lane."""

    def status(self, model_id: str) -> tuple[str, LastError | None]:
        return "available", None

    def workers(self) -> list[WorkerSummary]:
        return [WorkerSummary("w-1", "default", "default", "default", gpu_count=1, loaded_models=(MINILM,))]

    def residency(self, model_id: str) -> list:
        return []


class Answering:
    """Consumes the default lane and answers every item; keeps what it received."""

    def __init__(self, transport: LoopbackTransport) -> None:
        self.transport = transport
        self.items: list[WorkItem] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def run(self, consumer: LaneConsumer) -> None:
        while True:
            for delivery in await consumer.fetch(64, 10.0):
                self.items.append(delivery.item)
                await self.gate.wait()
                item = delivery.item
                values = {"dense": {"dims": 1, "dtype": "float32", "values": [1.0]}}
                result = WorkResult(work_item_id=item.work_item_id, request_id=item.request_id,
                                    item_index=item.item_index, success=True, result_msgpack=packb(values))  # fmt: skip
                await self.transport.publish_result(item.reply_subject, result)
                await delivery.ack()


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")


@asynccontextmanager
async def gateway(
    catalog: Catalog, **pool_settings: object
) -> AsyncIterator[tuple[httpx.AsyncClient, Answering, Telemetry]]:
    """The app wired as the roles wire it: pools in memory with the static queue pool `batch`, lane signals over
    them, metrics reading the signals; a worker answering on the default lane."""
    settings = PoolSettings(**{"static_queue_pools": ("batch",), **pool_settings})
    async with AsyncExitStack() as stack:
        transport = await stack.enter_async_context(LoopbackTransport())
        status = Workers()
        pools = await stack.enter_async_context(
            PoolDirectory(MemoryPoolStore(), settings.static_queue_pools, settings.default_ttl_s, status.workers,
                          refresh_interval_s=0.1, catalog=lambda: catalog)
        )  # fmt: skip
        signals = LaneSignals(
            DemandTracker(settings.demand_ttl_s), pools.warm_floors, status.workers, pools.pinned_models_loaded
        )
        telemetry = Telemetry()
        metrics = GatewayMetrics(telemetry, ModelLabels(), signals)
        sources = GatewaySources(lambda: catalog, transport, QueueConsumers(transport), status, metrics=metrics,
                                 pools=pools, signals=signals)  # fmt: skip
        app = build_gateway_app(sources, GatewaySettings(request_timeout_s=5.0), LaneSettings(), "gw-p", (), settings)
        worker = Answering(transport)
        task = asyncio.ensure_future(worker.run(await transport.consumer(LANE)))
        stack.callback(task.cancel)
        await stack.enter_async_context(app.router.lifespan_context(app))
        client = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
        )
        yield client, worker, telemetry


def detail(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()["detail"]
    assert body["code"] == code, body
    return body


async def test_the_protected_pools_are_listed_and_cannot_be_deleted(catalog: Catalog) -> None:
    async with gateway(catalog) as (client, _, _):
        listed = (await client.get("/v1/pools")).json()["pools"]
        assert [(pool["spec"]["name"], pool["protected"], pool["status"]["state"]) for pool in listed] == [
            ("default", True, "active"),
            ("batch", True, "active"),
        ]
        assert [worker["name"] for worker in listed[0]["status"]["assigned_workers"]] == ["w-1"]
        detail(await client.delete("/v1/pools/default"), 403, "POOL_PROTECTED")
        detail(await client.delete("/v1/pools/batch"), 403, "POOL_PROTECTED")
        detail(await client.post("/v1/pools", json={"name": "default", "gpus": {"l4": 1}}), 403, "POOL_PROTECTED")


async def test_create_get_renew_delete(catalog: Catalog) -> None:
    async with gateway(catalog) as (client, _, _):
        created = await client.post("/v1/pools", json={"name": "Acme", "gpus": {"default": 1}, "ttl_seconds": 60})
        assert created.status_code == 201, created.text
        pool = created.json()
        assert pool["spec"]["name"] == "acme" and pool["spec"]["queue_pool"] == "default"
        assert pool["spec"]["gpus"] == {"default": 1} and pool["spec"]["ttl_seconds"] == 60
        assert pool["status"]["state"] == "active"  # the default-profile worker covers it
        assert [worker["name"] for worker in pool["status"]["assigned_workers"]] == ["w-1"]
        got = (await client.get("/v1/pools/ACME")).json()
        assert got["spec"] == pool["spec"]
        # The public SDK re-POSTs a pool to update it: same name, new spec, lease renewed.
        await asyncio.sleep(0.01)
        updated = await client.post("/v1/pools", json={"name": "acme", "gpus": {"default": 2}, "ttl_seconds": 60})
        assert updated.status_code == 200 and updated.json()["spec"]["gpus"] == {"default": 2}
        assert updated.json()["status"]["created_at"] == pool["status"]["created_at"]
        assert updated.json()["status"]["expires_at"] > pool["status"]["expires_at"]
        pool = updated.json()
        await asyncio.sleep(0.01)
        renewed = await client.post("/v1/pools/acme/renew")
        assert renewed.status_code == 200
        assert renewed.json()["status"]["expires_at"] > pool["status"]["expires_at"]
        assert [p["spec"]["name"] for p in (await client.get("/v1/pools")).json()["pools"]][-1] == "acme"
        assert (await client.delete("/v1/pools/acme")).json() == {"deleted": "acme"}
        detail(await client.get("/v1/pools/acme"), 404, "POOL_NOT_FOUND")
        detail(await client.delete("/v1/pools/acme"), 404, "POOL_NOT_FOUND")
        detail(await client.post("/v1/pools/acme/renew"), 404, "POOL_NOT_FOUND")


@pytest.mark.parametrize(
    "body",
    [
        {"name": "bad.name", "gpus": {"l4": 1}},
        {"name": "x", "gpus": {}},
        {"name": "x"},
        {"name": "x", "gpus": {"l4": 1}, "colour": "red"},
        {"name": "x", "gpus": {"l4": 1}, "queue_pool": "nowhere"},
        {"name": "x", "gpus": {"l4": "two"}},
        {"name": "x", "gpus": {"l4": 1}, "ttl_seconds": 0},
    ],
)
async def test_bad_pool_bodies_are_400(catalog: Catalog, body: dict) -> None:
    async with gateway(catalog) as (client, _, _):
        detail(await client.post("/v1/pools", json=body), 400, "INVALID_POOL")
        assert [p["spec"]["name"] for p in (await client.get("/v1/pools")).json()["pools"]] == ["default", "batch"]


async def test_pinned_models_must_be_tracked_and_are_stored_as_the_catalogue_names_them(catalog: Catalog) -> None:
    async with gateway(catalog) as (client, _, telemetry):
        body = {
            "name": "pinned",
            "gpus": {"default": 1},
            "pinned_models": [f"{MINILM.upper()}:default", f"{MINILM}:int8"],
        }
        created = await client.post("/v1/pools", json=body)
        assert created.status_code == 201, created.text
        assert created.json()["spec"]["pinned_models"] == [MINILM, f"{MINILM}:int8"]
        text = telemetry.prometheus_text().decode()  # w-1, assigned, has MiniLM loaded but not its int8 variant
        assert f'sie_gateway_pool_pinned_model_loaded{{model="{MINILM}",pool="pinned"}} 1.0' in text
        assert f'sie_gateway_pool_pinned_model_loaded{{model="{MINILM}:int8",pool="pinned"}} 0.0' in text
        unknown = {"name": "other", "gpus": {"default": 1}, "pinned_models": ["org/not-a-model"]}
        assert "org/not-a-model" in detail(await client.post("/v1/pools", json=unknown), 400, "INVALID_POOL")["message"]


async def test_a_lease_expires_unless_renewed(catalog: Catalog) -> None:
    async with gateway(catalog) as (client, _, _):
        assert (
            await client.post("/v1/pools", json={"name": "brief", "gpus": {"default": 1}, "ttl_seconds": 1})
        ).status_code == 201

        async def gone() -> bool:
            return (await client.get("/v1/pools/brief")).status_code == 404

        await eventually(gone, timeout_s=5.0)
        assert "brief" not in [p["spec"]["name"] for p in (await client.get("/v1/pools")).json()["pools"]]
        detail(await client.post(ENCODE, json=TEXT, headers={"X-SIE-Pool": "brief"}), 404, "POOL_NOT_FOUND")


async def test_a_named_pool_that_does_not_exist_fails_closed_and_publishes_nothing(catalog: Catalog) -> None:
    async with gateway(catalog) as (client, worker, _):
        detail(await client.post(ENCODE, json=TEXT, headers={"X-SIE-Pool": "nobody"}), 404, "POOL_NOT_FOUND")
        detail(await client.post(ENCODE, json=TEXT, headers={"X-SIE-MACHINE-PROFILE": "nobody/default"}), 404,
               "POOL_NOT_FOUND")  # fmt: skip
        openai = await client.post("/v1/embeddings", json={"model": MINILM, "input": "x"}, headers={"X-SIE-Pool": "x"})
        assert openai.status_code == 404 and openai.json()["error"]["code"] == "POOL_NOT_FOUND"
        detail(await client.post(ENCODE, json=TEXT, headers={"X-SIE-Pool": "bad.pool"}), 400, "INVALID_POOL")
        assert worker.items == []


async def test_a_logical_pool_publishes_on_its_queue_pool_with_its_name_as_admission_pool(catalog: Catalog) -> None:
    async with gateway(catalog) as (client, worker, _):
        await client.post("/v1/pools", json={"name": "acme", "gpus": {"default": 1}})
        served = await client.post(ENCODE, json=TEXT, headers={"X-SIE-Pool": "acme"})
        assert served.status_code == 200, served.text
        plain = await client.post(ENCODE, json=TEXT)
        assert plain.status_code == 200
        assert [(item.pool_name, item.admission_pool) for item in worker.items] == [
            ("default", "acme"),
            ("default", "default"),
        ]


async def test_provisioning_records_demand_that_publishing_serves(catalog: Catalog) -> None:
    async with gateway(catalog, demand_ttl_s=60.0) as (client, _, telemetry):
        await client.post("/v1/pools", json={"name": "gpus", "gpus": {"l4": 2, "a100": 1}, "minimum_worker_count": 2})
        cold = await client.post(ENCODE, json=TEXT, headers={"X-SIE-Pool": "gpus"})
        assert cold.status_code == 503 and cold.headers["x-sie-error-code"] == "PROVISIONING", cold.text
        assert cold.headers["retry-after"] == "60"
        lanes = {(lane["pool"], lane["machine_profile"], lane["bundle"]): lane
                 for lane in (await client.get("/v1/scaling/lanes")).json()["lanes"]}  # fmt: skip
        # No machine profile named: every profile the pool asks for wakes.
        for profile in ("a100", "l4"):
            lane = lanes[("default", profile, "default")]
            assert (lane["pending_demand"], lane["warm_floor"], lane["workers"], lane["demand"]) == (1, 2, 0, 1)
        assert lanes[("default", "default", "default")]["workers"] == 1
        one = (await client.get("/v1/scaling/lanes/default/L4/default")).json()
        assert one["pending_demand"] == 1 and one["machine_profile"] == "l4"
        nobody = (await client.get("/v1/scaling/lanes/x/y/z")).json()
        assert (nobody["pending_demand"], nobody["demand"], nobody["warm_floor"]) == (0, 0, 0)
        text = telemetry.prometheus_text().decode()
        assert 'sie_gateway_lane_pending_demand{bundle="default",machine_profile="l4",pool="default"} 1.0' in text
        assert 'sie_gateway_pool_warm_floor{bundle="default",machine_profile="a100",pool="default"} 2.0' in text
        # Work published to the default lane serves only that lane's demand.
        await client.post(ENCODE, json=TEXT, headers={"X-SIE-MACHINE-PROFILE": "gpus/l4"})
        assert (await client.get("/v1/scaling/lanes/default/l4/default")).json()["pending_demand"] == 2
        served = await client.post(ENCODE, json=TEXT)
        assert served.status_code == 200
        assert (await client.get("/v1/scaling/lanes/default/l4/default")).json()["pending_demand"] == 2
        await client.delete("/v1/pools/gpus")
        assert (await client.get("/v1/scaling/lanes/default/a100/default")).json()["warm_floor"] == 0


async def test_lane_backpressure_sheds_only_when_enforced(catalog: Catalog) -> None:
    async with gateway(catalog, max_lane_in_flight_items=1, lane_backpressure_enforce=True) as (client, worker, tel):
        worker.gate.clear()  # the worker holds its answers: the first request stays in flight
        first = asyncio.ensure_future(client.post(ENCODE, json=TEXT))

        async def in_flight() -> bool:
            return len(worker.items) == 1

        await eventually(in_flight, timeout_s=5.0)
        shed = await client.post(ENCODE, json=TEXT)
        assert shed.status_code == 503 and shed.headers["x-sie-error-code"] == "QUEUE_FULL", shed.text
        assert shed.headers["retry-after"] == "5"
        worker.gate.set()
        assert (await first).status_code == 200
        assert (await client.post(ENCODE, json=TEXT)).status_code == 200
        text = tel.prometheus_text().decode()
        lane = 'bundle="default",decision="{}",machine_profile="default",pool="default"'
        assert f"sie_gateway_lane_admission_decisions_total{{{lane.format('shed')}}} 1.0" in text
        assert f"sie_gateway_lane_admission_decisions_total{{{lane.format('admitted')}}} 2.0" in text
