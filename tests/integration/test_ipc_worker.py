"""A real WorkerService over the baseline models behind IpcServer, called through UdsWorkerClient: the worker role's
IPC path end to end, plus round-trip rates for Ping and a 32-item encode RunBatch (printed, not asserted).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest

from sie.ipc.server import IpcServer
from sie.ipc.uds_client import UdsWorkerClient
from sie.settings import BatchingSettings, LaneSettings
from sie.wire.ipc_batch import DISPOSITION_PUBLISH_AND_ACK, EncodeBatchItem, RunBatchItem, RunBatchRequest
from sie.wire.ipc_control import (
    MODEL_STATE_LOADING_IN_PROGRESS,
    MODEL_STATE_LOADING_STARTED,
    MODEL_STATE_READY,
    MODEL_STATE_RETRY_LATER,
    DrainRequest,
    EnsureModelReadyRequest,
    EnsureModelReadyResponse,
    ModelControlStatusRequest,
    PingRequest,
    UnloadModelRequest,
    WorkerCapabilitiesRequest,
)
from sie.worker.manager import ModelManager
from sie.worker.null_backend import NullWorkerService
from sie.worker.runner import BatchRunner
from sie.worker.service import WorkerService
from support.polling import eventually

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
HELLO_WORLD_HEAD = [-0.034477, 0.031023, 0.006735, 0.026109]


def encode_batch(batch_id: int, texts: list[str]) -> RunBatchRequest:
    items = []
    for index, text in enumerate(texts):
        body = EncodeBatchItem(
            work_item_id=f"r{batch_id}.{index}", request_id=f"r{batch_id}", item_index=index,
            total_items=len(texts), timestamp=0.0, item={"text": text},
        )  # fmt: skip
        items.append(RunBatchItem(op="encode", work_item_id=body.work_item_id, request_id=body.request_id,
                                  item_index=index, encode=body))  # fmt: skip
    return RunBatchRequest(model_id=MINILM, batch_id=batch_id, lora_key="", total_cost=len(texts), items=items)


@pytest.fixture()
def socket_path():
    directory = tempfile.mkdtemp(prefix="sie-ipc-", dir="/tmp")
    yield Path(directory) / "worker.sock"
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture()
async def service(baseline_catalog, load_model):
    async with ModelManager(baseline_catalog, lambda model, profile, model_id: load_model(model_id)) as manager:
        yield WorkerService(manager, BatchRunner(manager), "worker-ipc", LaneSettings(), BatchingSettings())


async def wait_ready(client: UdsWorkerClient, model_id: str) -> list[str]:
    """Poll EnsureModelReady until the model is ready; the states seen, in order, deduplicated."""
    states: list[str] = []

    async def ready() -> bool:
        answer: EnsureModelReadyResponse = await client.ensure_model_ready(EnsureModelReadyRequest(model_id=model_id))
        if not states or states[-1] != answer.state:
            states.append(answer.state)
        if answer.state == MODEL_STATE_READY:
            assert answer.descriptor is not None and answer.descriptor.supports_run_batch
            return True
        assert answer.state in (MODEL_STATE_LOADING_STARTED, MODEL_STATE_LOADING_IN_PROGRESS), answer
        return False

    await eventually(ready, timeout_s=120.0, interval_s=0.02, what=f"{model_id} to be ready")
    return states


async def rate(call: Callable[[], Awaitable[object]], seconds: float = 1.0, concurrency: int = 1) -> float:
    """Completed calls per second over about `seconds`, with `concurrency` callers."""
    done = 0
    stop = time.perf_counter() + seconds

    async def caller() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await call()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return done / (time.perf_counter() - started)


async def test_the_worker_over_ipc(service: WorkerService, socket_path: Path):
    async with IpcServer(service, socket_path, worker_id="worker-ipc"), UdsWorkerClient(socket_path) as client:
        ping = await client.ping(PingRequest(timestamp_ms=123.0))
        assert (ping.worker_id, ping.timestamp_ms, ping.ready) == ("worker-ipc", 123.0, True)

        states = await wait_ready(client, MINILM)
        assert states[0] == MODEL_STATE_LOADING_STARTED and states[-1] == MODEL_STATE_READY

        outcome = await client.run_batch(encode_batch(1, ["Hello world", "Bye"]))
        first = outcome.outcomes[0]
        assert (first.disposition, first.work_item_id) == (DISPOSITION_PUBLISH_AND_ACK, "r1.0")
        dense = first.result_msgpack.value["dense"]
        assert np.allclose(dense["values"][:4], HELLO_WORLD_HEAD, atol=1e-5)

        capabilities = await client.worker_capabilities(WorkerCapabilitiesRequest())
        assert MINILM in capabilities.supported_models and MINILM in capabilities.loaded_models
        assert (await client.ping(PingRequest(timestamp_ms=1.0))).loaded_models == [MINILM]

        assert (await client.drain(DrainRequest(deadline_ms=1000))).acknowledged is True
        assert service.draining is True


async def test_a_pin_over_ipc_loads_the_model_and_holds_it_until_released(service: WorkerService, socket_path: Path):
    async with IpcServer(service, socket_path, worker_id="worker-ipc"), UdsWorkerClient(socket_path) as client:
        released = await client.ensure_model_ready(EnsureModelReadyRequest(model_id=MINILM, pin=False))
        assert released.state == MODEL_STATE_RETRY_LATER and not service.manager.is_loaded(MINILM)  # no load
        pinned = await client.ensure_model_ready(EnsureModelReadyRequest(model_id=MINILM, pin=True))
        assert pinned.state == MODEL_STATE_LOADING_STARTED  # the pin starts the load, no request needed
        await wait_ready(client, MINILM)
        assert service.manager.held == {MINILM}
        await client.ensure_model_ready(EnsureModelReadyRequest(model_id=MINILM, pin=False))
        assert service.manager.held == set() and service.manager.is_loaded(MINILM)  # loaded, evictable again


async def test_unload_over_ipc_frees_a_loaded_model_and_its_pin_but_keeps_a_preloaded_one(
    service: WorkerService, socket_path: Path
):
    async with IpcServer(service, socket_path, worker_id="worker-ipc"), UdsWorkerClient(socket_path) as client:
        absent = await client.unload_model(UnloadModelRequest(model_id=MINILM))
        assert (absent.unloaded, absent.reason) == (False, "not loaded")
        await client.ensure_model_ready(EnsureModelReadyRequest(model_id=MINILM, pin=True))
        await wait_ready(client, MINILM)
        held_bytes = service.manager.model_memory_bytes(MINILM)
        unloaded = await client.unload_model(UnloadModelRequest(model_id=MINILM))
        assert unloaded.unloaded and unloaded.memory_freed_bytes == held_bytes > 0
        assert not service.manager.is_loaded(MINILM) and service.manager.held == set()  # the pin ended here too
        assert (await client.ping(PingRequest(timestamp_ms=1.0))).loaded_models == []

        service.manager.pin([MINILM])  # what SIE_PRELOAD_MODELS does
        await wait_ready(client, MINILM)
        kept = await client.unload_model(UnloadModelRequest(model_id=MINILM))
        assert not kept.unloaded and "preloaded" in kept.reason and service.manager.is_loaded(MINILM)


async def test_model_control_status_reports_each_models_memory_and_measured_cost(
    service: WorkerService, socket_path: Path
):
    async with IpcServer(service, socket_path), UdsWorkerClient(socket_path) as client:
        before = await client.model_control_status(ModelControlStatusRequest())
        assert (before.worker_id, before.device, before.ready) == ("worker-ipc", "cpu", True)
        assert (before.models, before.memory_used_bytes, before.compute_seconds_total) == ([], 0, 0.0)

        await wait_ready(client, MINILM)
        (loaded,) = (await client.model_control_status(ModelControlStatusRequest())).models
        assert (loaded.model_id, loaded.state, loaded.batches, loaded.cost_per_item_s) == (
            MINILM, MODEL_STATE_READY, 0, None
        )  # fmt: skip
        assert loaded.memory_bytes > 0 and loaded.batched is True
        assert loaded.max_batch_items == BatchingSettings().max_batch_items

        await client.run_batch(encode_batch(1, ["Hello world", "Bye"]))
        await client.run_batch(encode_batch(2, ["one", "two", "three", "four"]))
        status = await client.model_control_status(ModelControlStatusRequest())
        (entry,) = status.models
        assert (entry.batches, entry.items) == (2, 6)
        assert entry.compute_seconds > 0 and entry.cost_per_item_s is not None and entry.cost_per_item_s > 0
        assert status.compute_seconds_total == entry.compute_seconds
        assert status.memory_used_bytes == entry.memory_bytes == loaded.memory_bytes
        assert status.memory_budget_bytes is None  # this manager was given none

        await client.drain(DrainRequest())
        assert (await client.model_control_status(ModelControlStatusRequest())).ready is False


async def test_null_backend_model_control_status_counts_batches(baseline_catalog, socket_path: Path):
    service = NullWorkerService(baseline_catalog, "worker-null", 64, device="cuda:3")
    async with IpcServer(service, socket_path), UdsWorkerClient(socket_path) as client:
        await client.run_batch(encode_batch(3, ["a", "b", "c"]))
        status = await client.model_control_status(ModelControlStatusRequest())
    assert (status.worker_id, status.device, status.ready) == ("worker-null", "cuda:3", True)
    entries = {entry.model_id: entry for entry in status.models}
    assert set(entries) == set(baseline_catalog.entries)
    assert (entries[MINILM].state, entries[MINILM].batches, entries[MINILM].items) == (MODEL_STATE_READY, 1, 3)
    assert entries[MINILM].max_batch_items == 64


async def test_round_trip_rates(service: WorkerService, socket_path: Path):
    texts = [f"sentence number {i} about the weather" for i in range(32)]
    request = encode_batch(7, texts)
    async with IpcServer(service, socket_path), UdsWorkerClient(socket_path) as client:
        await wait_ready(client, MINILM)
        await client.run_batch(request)  # warm-up
        ping = PingRequest(timestamp_ms=1.0)
        ping_serial = await rate(lambda: client.ping(ping))
        ping_parallel = await rate(lambda: client.ping(ping), concurrency=16)
        batch_ipc = await rate(lambda: client.run_batch(request), seconds=2.0)
        batch_direct = await rate(lambda: service.run_batch(request), seconds=2.0)
    print(
        f"\nIPC Ping: {ping_serial:,.0f}/s serial, {ping_parallel:,.0f}/s with 16 callers"
        f"\n32-item encode RunBatch: {batch_ipc:,.1f}/s over IPC, {batch_direct:,.1f}/s direct "
        f"({batch_ipc * 32:,.0f} vs {batch_direct * 32:,.0f} items/s)"
    )


async def test_null_backend_round_trip_rate(baseline_catalog, socket_path: Path):
    """What the IPC path carries on its own: the null backend answers without a model."""
    request = encode_batch(9, [f"sentence number {i}" for i in range(32)])
    service = NullWorkerService(baseline_catalog, "worker-null", 64)
    async with IpcServer(service, socket_path), UdsWorkerClient(socket_path) as client:
        outcome = await client.run_batch(request)
        assert [o.work_item_id for o in outcome.outcomes] == [f"r9.{i}" for i in range(32)]
        serial = await rate(lambda: client.run_batch(request))
        parallel = await rate(lambda: client.run_batch(request), concurrency=4)
    print(
        f"\nnull-backend 32-item RunBatch over IPC: {serial * 32:,.0f} items/s serial, "
        f"{parallel * 32:,.0f} with 4 callers"
    )
