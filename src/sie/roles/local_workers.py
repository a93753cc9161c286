"""The worker children a process runs itself (`--role worker` on one device, `--role all` on every device of
SIE_WORKER_DEVICES): one model manager and worker service per device with its load and inference threads, its share
of the cores and of the memory, and SIE_PRELOAD_MODELS loaded; and, for `all`, the gateway's model status read
straight from their managers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack

import attrs

from sie.catalog import Catalog
from sie.gateway.status import LastError, WorkerSummary
from sie.roles.serving import RoleSetupError, open_telemetry
from sie.settings import LaneSettings, Settings
from sie.telemetry.tracing import Tracing
from sie.telemetry.worker import WorkerMetrics
from sie.wire.ipc_control import ModelResidency
from sie.worker.devices import CPU, Device, DeviceError, load_cuda_libraries, memory_budget, resolve_devices
from sie.worker.errors import ModelLoadError
from sie.worker.loading import ModelLoader
from sie.worker.manager import ModelManager, ModelState, ModelStatus
from sie.worker.null_backend import NullWorkerService
from sie.worker.runner import BatchRunner
from sie.worker.service import WorkerService

logger = logging.getLogger(__name__)


async def preload(manager: ModelManager, model_ids: tuple[str, ...]) -> None:
    """Load each model before serving; a failure is logged and leaves the model in its failed state."""
    for model_id in model_ids:
        try:
            await manager.wait_ready(model_id)
            logger.info("preloaded %s", model_id)
        except ModelLoadError as exc:
            logger.error("preloading %s failed (%s): %s", model_id, exc.error_class, exc.message)


@attrs.frozen
class LocalWorker:
    """One worker child of this process: its name (`worker-{i}`), its device (`cpu`, `cuda:N`), the service the
    sidecar calls and the manager behind it."""

    service: WorkerService | NullWorkerService
    manager: ModelManager
    name: str = "worker-0"
    device: str = CPU


async def open_local_workers(
    stack: AsyncExitStack,
    settings: Settings,
    catalog: Catalog,
    devices: list[Device] | None = None,
    tracing: Tracing | None = None,
) -> list[LocalWorker]:
    """One worker per device of SIE_WORKER_DEVICES (or `devices`, already resolved), each with its own model
    manager, load thread and inference thread (entered on `stack`), its share of the cores and of the memory,
    and SIE_PRELOAD_MODELS loaded; their batches are spans of `tracing`. Raises RoleSetupError when the host lacks
    the devices asked for."""
    try:
        devices = resolve_devices(settings.worker.devices) if devices is None else devices
        cpu_children = sum(1 for device in devices if device.kind == CPU)
        if cpu_children < len(devices):
            load_cuda_libraries()
    except DeviceError as exc:
        raise RoleSetupError(str(exc)) from exc
    workers = []
    for index, device in enumerate(devices):
        worker_id = settings.process.worker_id if len(devices) == 1 else f"{settings.process.worker_id}-{index}"
        budget = memory_budget(device, settings.worker.memory_budget_bytes, cpu_children=cpu_children)
        child = attrs.evolve(
            settings,
            process=attrs.evolve(settings.process, worker_id=worker_id),
            worker=attrs.evolve(
                settings.worker,
                devices=device.name,
                intra_op_threads=settings.worker.intra_op_threads or device.intra_op_threads,
                memory_budget_bytes=budget,
            ),
        )
        workers.append(await _open_local_worker(stack, child, catalog, device.name, f"worker-{index}", tracing))
    preloads = settings.worker.preload_models
    await asyncio.gather(*(preload(worker.manager, preloads) for worker in workers))
    return workers


async def _open_local_worker(
    stack: AsyncExitStack, settings: Settings, catalog: Catalog, device: str, name: str, tracing: Tracing | None
) -> LocalWorker:
    """The model manager (entered on `stack`) with SIE_PRELOAD_MODELS pinned, and the worker service (ONNX or
    null backend, SIE_WORKER_BACKEND) of one device; `settings` are this child's own."""
    worker = settings.worker
    # One thread loads models and one runs them (onnxruntime parallelises inside a run); shut down after
    # the manager, which `stack` closes first.
    load_pool = _one_thread(stack, f"sie-load-{name}")
    infer_pool = _one_thread(stack, f"sie-infer-{name}")
    loader = ModelLoader.from_settings(worker, device)
    # The child's own series (model loads, memory), which `/metrics` merges with its worker name and device.
    telemetry = open_telemetry(stack, settings, "sie-worker", {"sie.worker": name, "sie.device": device})
    metrics = WorkerMetrics(telemetry) if telemetry.enabled else None
    manager = await stack.enter_async_context(
        ModelManager(catalog, loader.load, load_pool, worker.memory_budget_bytes, worker.max_loaded_models, metrics)
    )
    manager.pin(worker.preload_models)
    worker_id, batching = settings.process.worker_id, settings.batching
    logger.info("%s (%s) on %s: %s intra-op threads, memory budget %s bytes", name, worker_id, device,
                worker.intra_op_threads, worker.memory_budget_bytes)  # fmt: skip
    if worker.backend == "null":
        service = NullWorkerService(catalog, worker_id, batching.max_batch_items, device, worker.null_item_time_s)
        return LocalWorker(service, manager, name, device)
    runner = BatchRunner(manager, infer_pool, tracing)
    service = WorkerService(manager, runner, worker_id, settings.lane, batching, device, tracing)
    return LocalWorker(service, manager, name, device)


def _one_thread(stack: AsyncExitStack, name: str) -> ThreadPoolExecutor:
    """A one-thread executor, shut down (after its running call ends) when `stack` closes."""
    pool = ThreadPoolExecutor(1, thread_name_prefix=name)
    stack.push_async_callback(asyncio.to_thread, pool.shutdown)
    return pool


# When children disagree, a model shows the state of the child furthest along: loaded anywhere is loaded.
_PRECEDENCE = (ModelState.LOADED, ModelState.LOADING, ModelState.UNLOADING, ModelState.AVAILABLE, ModelState.FAILED)


class LocalModelStatus:
    """Model states straight from the children's managers; each child listed as a worker."""

    def __init__(self, workers: Sequence[LocalWorker], lane: LaneSettings) -> None:
        self.children = tuple(workers)
        self.lane = lane

    def status(self, model_id: str) -> tuple[str, LastError | None]:
        status = _furthest([worker.manager.status(model_id) for worker in self.children])
        failure = status.last_error
        last_error = (
            LastError(failure.error_class, failure.message, failure.attempts, failure.permanent) if failure else None
        )
        return str(status.state), last_error

    def residency(self, model_id: str) -> Sequence[ModelResidency]:
        return [
            ModelResidency(model_id=loaded.model_id, worker=worker.service.worker_id, device=worker.device,
                           precision=loaded.precision)
            for worker in self.children
            for loaded in worker.manager.resident
            if loaded.model_id == model_id
        ]  # fmt: skip

    def workers(self) -> Sequence[WorkerSummary]:
        lane = self.lane
        return [
            WorkerSummary(
                name=worker.service.worker_id,
                pool=lane.pool,
                machine_profile=lane.machine_profile,
                bundle=lane.bundle,
                gpu_count=1 if worker.device.startswith("cuda") else 0,
                loaded_models=tuple(worker.manager.loaded_models),
            )
            for worker in self.children
        ]


def _furthest(statuses: Sequence[ModelStatus]) -> ModelStatus:
    return min(statuses, key=lambda status: _PRECEDENCE.index(status.state))
