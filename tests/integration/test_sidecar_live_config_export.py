"""Live config on a worker, the export path: the real config service app (MemoryConfigStore) over httpx's ASGI
transport, a real WorkerService, and the live config's reconciler between them. The acknowledged epoch/hash
advance only when the worker's hash equals the control plane's pool-scoped one; unchanged exports are not
resent; an epoch rewind is accepted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import httpx
import pytest

from sie.catalog import load_catalog
from sie.control.auth import AccessPolicy
from sie.control.http.app import build_control_app
from sie.control.loading import load_registry
from sie.control.writes import ConfigWriter
from sie.settings import BatchingSettings, LaneSettings, load_settings
from sie.sidecar.live_config import LiveConfig
from sie.stores.config_store import MemoryConfigStore
from sie.transport.loopback import LoopbackTransport
from sie.wire.ipc_control import ReplaceModelConfigsRequest, ReplaceModelConfigsResponse
from sie.worker.manager import ModelManager
from sie.worker.runner import BatchRunner
from sie.worker.service import WorkerService
from support.polling import eventually

REPO = Path(__file__).resolve().parents[2]
BUNDLES, MODELS = REPO / "config" / "bundles", REPO / "config" / "models"
NEW_MODEL = "acme/new-model"
OTHER_POOL_MODEL = "acme/other-pool"
ADAPTER = "sie.adapters.dense:OnnxDenseAdapter"


def model_yaml(model_id: str, extra: str = "") -> str:
    return (
        f"sie_id: {model_id}\nhf_id: {model_id}\n{extra}"
        f"profiles:\n  default:\n    adapter_path: {ADAPTER}\n    max_batch_tokens: 8192\n"
    )


class ConfigService(httpx.AsyncBaseTransport):
    """A config service at one address, served through ASGI; `restart` puts a fresh one (epoch 0, in-memory
    store) there, as after it lost its store."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        registry = load_registry(BUNDLES, MODELS)
        writer = ConfigWriter(registry, MemoryConfigStore(), router_id="sie-config-0")
        self._app = httpx.ASGITransport(app=build_control_app(writer, registry, AccessPolicy()))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._app.handle_async_request(request)


def config_client(service: ConfigService | None = None) -> httpx.AsyncClient:
    """A client of `service`, by default a fresh config service (epoch 0, in-memory store)."""
    return httpx.AsyncClient(transport=service or ConfigService(), base_url="http://config")


class CountingWorker:
    """A thin wrapper over the real WorkerService: counts replacements, optionally corrupts the hash."""

    def __init__(self, service: WorkerService, *, corrupt_hash: bool = False) -> None:
        self.service = service
        self.corrupt_hash = corrupt_hash
        self.replace_calls = 0

    def __getattr__(self, name: str):  # noqa: ANN204 - delegate every other IPC method
        return getattr(self.service, name)

    async def replace_model_configs(self, request: ReplaceModelConfigsRequest) -> ReplaceModelConfigsResponse:
        self.replace_calls += 1
        response = await self.service.replace_model_configs(request)
        return attrs.evolve(response, bundle_config_hash="0" * 64) if self.corrupt_hash else response


@pytest.fixture
async def manager() -> AsyncIterator[ModelManager]:
    async with ModelManager(load_catalog(BUNDLES, MODELS), lambda *args: None) as loaded:
        yield loaded


@pytest.fixture
def service(manager: ModelManager) -> WorkerService:
    return WorkerService(manager, BatchRunner(manager), "w-1", LaneSettings(), BatchingSettings())


async def post_models(http: httpx.AsyncClient) -> None:
    assert (await http.post("/v1/configs/models", content=model_yaml(NEW_MODEL))).status_code == 201
    other = model_yaml(OTHER_POOL_MODEL, extra="pool: GPU-Big\n")
    assert (await http.post("/v1/configs/models", content=other)).status_code == 201


async def pool_hash(http: httpx.AsyncClient) -> tuple[int, str]:
    export = (await http.get("/v1/configs/export")).json()
    return export["epoch"], export["bundle_pool_config_hashes"]["default"]["default"]


async def test_tick_replaces_catalogue_and_records_state(service: WorkerService, manager: ModelManager) -> None:
    settings = load_settings(environ={})
    worker = CountingWorker(service)
    async with config_client() as http, LoopbackTransport() as bus:
        await post_models(http)
        epoch, expected = await pool_hash(http)
        async with LiveConfig(bus, worker, settings, http=http, interval_s=0.01) as live:
            await eventually(lambda: live.epoch == epoch, what=f"epoch {epoch}")  # the first tick runs at start
            assert (live.epoch, live.bundle_config_hash) == (2, expected)
            assert manager.catalog.find(NEW_MODEL) is not None
            assert manager.catalog.find(OTHER_POOL_MODEL) is None  # assigned to another pool
            assert service.bundle_config_hash() == expected
            await asyncio.sleep(0.1)  # several more ticks on an unchanged export
            assert worker.replace_calls == 1 and live.replacements == 1
            assert await live.reconcile_once() is False and worker.replace_calls == 1


async def test_no_service_url_is_a_no_op(service: WorkerService) -> None:
    async with LoopbackTransport() as bus, LiveConfig(bus, service, load_settings(environ={})) as live:
        assert not live.reconciles_export


async def test_hash_mismatch_is_not_recorded_and_retried(service: WorkerService) -> None:
    worker = CountingWorker(service, corrupt_hash=True)
    async with config_client() as http, LoopbackTransport() as bus:
        await post_models(http)
        live = LiveConfig(bus, worker, load_settings(environ={}), http=http)
        assert await live.reconcile_once() is False
        assert (live.epoch, live.bundle_config_hash) == (0, "")
        assert await live.reconcile_once() is False
        assert worker.replace_calls == 2  # the snapshot stays eligible for retry


async def test_epoch_rewind_is_accepted(service: WorkerService, manager: ModelManager) -> None:
    config_service = ConfigService()
    async with config_client(config_service) as http, LoopbackTransport() as bus:
        live = LiveConfig(bus, service, load_settings(environ={}), http=http)
        await post_models(http)
        assert await live.reconcile_once() is True
        assert live.epoch == 2 and manager.catalog.find(NEW_MODEL) is not None
        config_service.restart()  # a fresh config service at the same address: epoch 0, baseline only
        epoch, expected = await pool_hash(http)
        assert epoch == 0
        assert await live.reconcile_once() is True
    assert (live.epoch, live.bundle_config_hash) == (0, expected)
    assert manager.catalog.find(NEW_MODEL) is None
