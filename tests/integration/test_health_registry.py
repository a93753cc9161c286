"""Heartbeats end to end in one process: a HealthPublisher pinging the real WorkerService publishes over
LoopbackTransport, and the gateway's WorkerRegistry (what `/health` and `/v1/models` read) follows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sie.catalog import parse_model_config
from sie.gateway.models import health_body, models_body
from sie.gateway.registry import WorkerRegistry
from sie.gateway.status import STATE_AVAILABLE, STATE_FAILED, STATE_LOADED
from sie.settings import BatchingSettings, LaneSettings
from sie.sidecar.pod.health import HealthPublisher, WorkerIdentity
from sie.transport.base import Lane
from sie.transport.loopback import LoopbackTransport
from sie.wire.ipc_control import MODEL_STATE_FAILED, EnsureModelReadyRequest
from sie.worker.manager import ModelManager
from sie.worker.runner import BatchRunner
from sie.worker.service import WorkerService
from support.polling import eventually

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
BROKEN = "acme/broken"
INTERVAL_S = 0.05
STALE_S = 0.3
IDENTITY = WorkerIdentity("worker-health", "default", "cpu", "default")
WAIT_S = 30.0


@pytest.fixture()
def catalog(baseline_catalog, tmp_path: Path):
    profile = {"adapter_path": "sie.adapters.dense:OnnxDenseAdapter", "max_batch_tokens": 1024}
    broken = parse_model_config(
        {"sie_id": BROKEN, "weights_path": str(tmp_path / "missing"), "profiles": {"default": profile}}
    )
    return baseline_catalog.with_models([broken])


@pytest.fixture()
async def service(catalog, load_model, model_loader):
    def load(model, profile, model_id):
        return model_loader.load(model, profile, model_id) if model_id == BROKEN else load_model(model_id)

    async with ModelManager(catalog, load) as manager:
        yield WorkerService(
            manager, BatchRunner(manager), IDENTITY.worker_id, LaneSettings(bundle=IDENTITY.bundle), BatchingSettings()
        )


@pytest.fixture()
async def transport():
    async with LoopbackTransport() as transport:
        yield transport


@pytest.fixture()
async def registry(transport):
    async with WorkerRegistry(transport, STALE_S) as registry:
        yield registry


def healthy(registry: WorkerRegistry) -> list[str]:
    return [heartbeat.worker_id for heartbeat in registry.healthy_workers()]


async def test_registry_sees_the_worker_and_its_loaded_model(transport, registry, service, catalog) -> None:
    await service.manager.wait_ready(MINILM)
    async with HealthPublisher(transport, service, IDENTITY, INTERVAL_S) as publisher:
        await eventually(lambda: registry.status(MINILM)[0] == STATE_LOADED, timeout_s=WAIT_S)
        assert publisher.ready
        (heartbeat,) = registry.healthy_workers(pool="default", machine_profile="CPU", bundle="default")
        assert heartbeat.worker_id == "worker-health"
        assert heartbeat.bundle_config_hash == service.bundle_config_hash() != ""
        assert registry.lanes_with_healthy_workers() == {Lane("default", "cpu", "default")}

        info = {model["name"]: model for model in models_body(catalog, registry)["models"]}
        assert info[MINILM]["loaded"] is True and info[MINILM]["state"] == STATE_LOADED
        assert info["rasyosef/splade-tiny"]["state"] == STATE_AVAILABLE
        health = health_body(catalog, registry, ())
        assert health["status"] == "healthy" and health["cluster"]["worker_count"] == 1
        assert health["workers"][0]["loaded_models"] == [MINILM]


async def test_draining_publisher_turns_unhealthy(transport, registry, service) -> None:
    async with HealthPublisher(transport, service, IDENTITY, INTERVAL_S) as publisher:
        await eventually(lambda: healthy(registry) == ["worker-health"], timeout_s=WAIT_S)
        publisher.begin_drain()
        await eventually(lambda: healthy(registry) == [], timeout_s=WAIT_S)
        assert [(worker.name, worker.healthy) for worker in registry.workers()] == [("worker-health", False)]
        assert not publisher.ready


async def test_draining_worker_turns_unhealthy(transport, registry, service) -> None:
    async with HealthPublisher(transport, service, IDENTITY, INTERVAL_S) as publisher:
        await eventually(lambda: healthy(registry) == ["worker-health"] and publisher.ready, timeout_s=WAIT_S)
        service.draining = True  # the worker's Ping now answers ready=False
        await eventually(lambda: healthy(registry) == [] and not publisher.ready, timeout_s=WAIT_S)


async def test_stopped_publisher_goes_stale(transport, registry, service, catalog) -> None:
    await service.manager.wait_ready(MINILM)
    async with HealthPublisher(transport, service, IDENTITY, INTERVAL_S):
        await eventually(lambda: registry.status(MINILM)[0] == STATE_LOADED, timeout_s=WAIT_S)
    await eventually(lambda: healthy(registry) == [], timeout_s=5.0)
    assert registry.status(MINILM) == (STATE_AVAILABLE, None)
    assert health_body(catalog, registry, ())["status"] == "degraded"


async def test_a_failed_load_reaches_v1_models(transport, registry, service, catalog) -> None:
    async with HealthPublisher(transport, service, IDENTITY, INTERVAL_S) as publisher:

        async def load_failed() -> bool:
            response = await service.ensure_model_ready(EnsureModelReadyRequest(model_id=BROKEN))
            publisher.observe(BROKEN, response)  # the hook the sidecar's readiness stage would call
            return response.state == MODEL_STATE_FAILED

        await eventually(load_failed, timeout_s=WAIT_S)
        await eventually(lambda: registry.status(BROKEN)[0] == STATE_FAILED, timeout_s=WAIT_S)
        _, last_error = registry.status(BROKEN)
        assert last_error is not None and last_error.code == "NOT_FOUND" and last_error.permanent
        assert "is not a directory" in last_error.message
        info = {model["name"]: model for model in models_body(catalog, registry)["models"]}
        assert info[BROKEN]["state"] == STATE_FAILED and info[BROKEN]["loaded"] is False
        assert info[BROKEN]["last_error"] == last_error.to_dict()
