"""The gateway's config read surface through HTTP (seed 000 §5, §6; contracts Part B §1.10): model and bundle
listings and YAML, resolve, 405 on writes, the worker-ack status rules, and deltas over the loopback bus.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from sie.catalog import Catalog, load_yaml, parse_bundle, parse_model_config
from sie.catalog.names import CONFIG_ALL_SUBJECT
from sie.gateway.config_sync import ConfigState, ConfigSync
from sie.gateway.http.app import GatewaySources, build_gateway_app
from sie.gateway.publisher import QueueConsumers
from sie.gateway.registry import WorkerRegistry
from sie.settings import ConfigSyncSettings, GatewaySettings, LaneSettings
from sie.transport.loopback import LoopbackTransport
from sie.wire.config import ConfigNotification
from sie.wire.health import WorkerHeartbeat
from support.gateway_fakes import NoWorkers
from support.polling import eventually

DENSE = "sie.adapters.dense:DenseAdapter"
SPARSE = "sie.adapters.sparse:SparseAdapter"


def model(sie_id: str, pool: str | None = None, adapter: str = DENSE) -> Any:
    data: dict[str, Any] = {
        "sie_id": sie_id, "hf_id": sie_id,
        "profiles": {"default": {"adapter_path": adapter, "max_batch_tokens": 512},
                     "fast": {"extends": "default", "max_batch_tokens": 64}},
    }  # fmt: skip
    if pool:
        data["pool"] = pool
    return parse_model_config(data)


def catalog() -> Catalog:
    bundles = [
        parse_bundle({"name": "default", "priority": 10, "adapters": ["sie.adapters.dense"]}),
        parse_bundle({"name": "gpu", "priority": 5, "adapters": ["sie.adapters.dense"], "engine": "onnxruntime"}),
        parse_bundle({"name": "sparse", "priority": 20, "adapters": ["sie.adapters.sparse"]}),
    ]
    orphan = parse_model_config(
        {"sie_id": "org/orphan", "hf_id": "o", "profiles": {"default": {"adapter_path": "gone.mod:A",
                                                                         "max_batch_tokens": 8}}}
    )  # fmt: skip
    return Catalog(bundles, [model("org/a"), model("org/p", pool="gpu-a"), model("org/s", adapter=SPARSE), orphan])


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def registry() -> WorkerRegistry:
    return WorkerRegistry(None, stale_s=10.0, clock=Clock())  # type: ignore[arg-type]  # fed via observe()


@pytest.fixture()
def state() -> ConfigState:
    state = ConfigState(catalog())
    state.epoch.set_max(42)
    return state


@pytest.fixture()
async def client(state: ConfigState, registry: WorkerRegistry):
    async with LoopbackTransport() as transport:
        sources = GatewaySources(state, transport, registry, registry, registry.healthy_workers)
        app = build_gateway_app(sources, GatewaySettings(), LaneSettings(), "gw-c")
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http,
        ):
            yield http


def beat(worker: str, bundle: str, digest: str, pool: str = "default", **fields: Any) -> WorkerHeartbeat:
    fields = {"ready": True, **fields}
    return WorkerHeartbeat(worker_id=worker, pool=pool, machine_profile="cpu", bundle=bundle, timestamp=1.0,
                           bundle_config_hash=digest, **fields)  # fmt: skip


# --- listings and YAML ------------------------------------------------------------------------------------


async def test_models_list_with_variants_and_sources(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/configs/models")
    assert response.status_code == 200
    rows = {row["model_id"]: row for row in response.json()["models"]}
    assert rows["org/a"] == {"model_id": "org/a", "profiles": ["default", "fast"], "source": "filesystem"}
    assert rows["org/a:fast"]["profiles"] == ["fast"]
    assert "org/a:default" not in rows


async def test_model_yaml_and_unknown_model(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/configs/models/org/a")
    assert response.headers["content-type"].startswith("application/x-yaml")
    assert load_yaml(response.text) == {"sie_id": "org/a", "source": "filesystem", "bundles": ["gpu", "default"]}
    missing = await client.get("/v1/configs/models/org/nope")
    assert missing.status_code == 404
    assert missing.json()["detail"]["code"] == "MODEL_NOT_FOUND"


async def test_bundles_list_and_yaml(client: httpx.AsyncClient, registry: WorkerRegistry) -> None:
    registry.observe(beat("w1", "default", ""))
    registry.observe(beat("w2", "default", ""))
    registry.observe(beat("w3", "gpu", "", ready=False))
    body = (await client.get("/v1/configs/bundles")).json()["bundles"]
    assert [row["bundle_id"] for row in body] == ["gpu", "default", "sparse"]
    assert {row["bundle_id"]: row["connected_workers"] for row in body} == {"gpu": 0, "default": 2, "sparse": 0}
    assert body[0] == {"bundle_id": "gpu", "engine": "onnxruntime", "priority": 5, "adapter_count": 1,
                       "source": "filesystem", "connected_workers": 0}  # fmt: skip
    yaml = await client.get("/v1/configs/bundles/gpu")
    assert yaml.headers["content-type"].startswith("application/x-yaml")
    assert load_yaml(yaml.text)["adapters"] == ["sie.adapters.dense"]
    missing = await client.get("/v1/configs/bundles/nope")
    assert missing.status_code == 404
    assert missing.json()["detail"] == {"code": "bundle_not_found", "message": "Bundle 'nope' does not exist.",
                                        "bundle_id": "nope"}  # fmt: skip


async def test_resolve(client: httpx.AsyncClient) -> None:
    ok = await client.post("/v1/configs/resolve", json={"model": "org/a:fast"})
    assert ok.json() == {"model": "org/a:fast", "resolved_bundle": "gpu", "compatible_bundles": ["gpu", "default"],
                         "profiles": ["default", "fast"]}  # fmt: skip
    override = await client.post("/v1/configs/resolve", json={"model": "default:/org/a"})
    assert override.json()["resolved_bundle"] == "default"
    conflict = await client.post("/v1/configs/resolve", json={"model": "org/a", "bundle": "sparse"})
    assert conflict.status_code == 409
    assert (await client.post("/v1/configs/resolve", json={"model": "x/y"})).status_code == 404
    assert (await client.post("/v1/configs/resolve", json={})).status_code == 400
    assert (await client.post("/v1/configs/resolve", content=b"{not json")).status_code == 400


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
async def test_writes_are_not_registered(client: httpx.AsyncClient, method: str) -> None:
    path = "/v1/configs/models" if method == "POST" else "/v1/configs/models/org/a"
    response = await client.request(method, path, content=b"sie_id: x")
    assert response.status_code == 405


# --- worker-ack status ------------------------------------------------------------------------------------


async def status(client: httpx.AsyncClient, model_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/configs/models/{model_id}/status")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


async def test_status_counts_healthy_exact_bundle_workers(client, state: ConfigState, registry) -> None:
    default_hash = state().bundle_config_hash("default", "default")
    gpu_hash = state().bundle_config_hash("gpu", "default")
    registry.observe(beat("w-ok", "default", default_hash))
    registry.observe(beat("w-old", "default", "stale"))
    registry.observe(beat("w-case", "Default", default_hash))  # other case: not this bundle's worker
    registry.observe(beat("w-sick", "default", "stale", ready=False))
    registry.observe(beat("w-drain", "default", "stale", draining=True))
    registry.observe(beat("g-1", "gpu", gpu_hash))
    body = await status(client, "org/a")
    assert body["model_id"] == "org/a" and body["config_epoch"] == 42 and body["source"] == "gateway-registry"
    assert body["no_bundles"] is False and body["all_bundles_acked"] is False
    rows = {row["bundle_id"]: row for row in body["bundles"]}
    assert rows["default"] == {
        "bundle_id": "default", "pool": "default", "expected_bundle_config_hash": default_hash,
        "total_eligible_workers": 2, "acked_workers": ["w-ok"], "pending_workers": ["w-old"], "acked": False,
    }  # fmt: skip
    assert rows["gpu"]["acked"] is True and rows["gpu"]["acked_workers"] == ["g-1"]
    registry.observe(beat("w-old", "default", default_hash))
    assert (await status(client, "org/a"))["all_bundles_acked"] is True


async def test_status_stale_worker_is_not_eligible(client, state: ConfigState, registry) -> None:
    registry.observe(beat("w-1", "default", "stale"))
    registry.clock.now += 60  # type: ignore[attr-defined]
    rows = {row["bundle_id"]: row for row in (await status(client, "org/a"))["bundles"]}
    assert rows["default"]["total_eligible_workers"] == 0
    assert rows["default"]["pending_workers"] == []


async def test_status_compares_each_worker_with_its_pool_scope(client, state: ConfigState, registry) -> None:
    scoped = state().bundle_config_hash("default", "gpu-a")
    assert scoped != state().bundle_config_hash("default")
    registry.observe(beat("p-1", "default", scoped, pool="gpu-a"))
    registry.observe(beat("p-2", "default", scoped, pool="default"))
    row = {r["bundle_id"]: r for r in (await status(client, "org/p"))["bundles"]}["default"]
    assert row["pool"] == "gpu-a" and row["expected_bundle_config_hash"] == scoped
    assert row["acked_workers"] == ["p-1"] and row["pending_workers"] == ["p-2"]


async def test_status_of_a_model_with_no_routable_bundle(client: httpx.AsyncClient) -> None:
    body = await status(client, "org/orphan")
    assert (body["all_bundles_acked"], body["no_bundles"], body["bundles"]) == (False, True, [])


async def test_status_suffix_on_an_unknown_model_is_a_plain_lookup(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/configs/models/org/nope/status")
    assert response.status_code == 404


async def test_plain_catalog_getter_has_no_workers_and_epoch_zero() -> None:
    fixed = catalog()
    async with LoopbackTransport() as transport:
        sources = GatewaySources(lambda: fixed, transport, QueueConsumers(transport), NoWorkers())
        app = build_gateway_app(sources, GatewaySettings(), LaneSettings(), "gw-all")
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http,
        ):
            body = await status(http, "org/a")
    assert body["config_epoch"] == 0
    assert all(row["total_eligible_workers"] == 0 and not row["acked"] for row in body["bundles"])


# --- ConfigSync over the loopback bus ---------------------------------------------------------------------


async def test_config_sync_applies_trusted_deltas_from_the_bus(state: ConfigState) -> None:
    yaml = "sie_id: org/new\nhf_id: org/new\nprofiles:\n  default:\n    adapter_path: " + DENSE
    yaml += "\n    max_batch_tokens: 64\n"
    settings = ConfigSyncSettings()
    async with LoopbackTransport() as transport, ConfigSync(state, transport, settings, None) as sync:
        assert sync.client is None and sync.poller is None
        for producer, epoch in (("intruder", 99), ("sie-config-0", 50)):
            await transport.publish(
                CONFIG_ALL_SUBJECT,
                ConfigNotification(router_id=producer, bundle_id="default", epoch=epoch, bundle_config_hash="",
                                   model_id="org/new", model_config=yaml),
            )  # fmt: skip
        await eventually(lambda: state.epoch.get() == 50, timeout_s=2.0)
    assert "org/new" in state().models
