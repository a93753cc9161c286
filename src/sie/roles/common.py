"""Wiring the role files share: running a role's main coroutine, the baseline catalogue, each role's HTTP
listener, and the local workers (one model manager + worker service per device) with their threads and
preloaded models."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from typing import Any

import attrs
from starlette.routing import Route

from sie.catalog import Catalog, load_catalog
from sie.gateway.http.auth import AuthSettingsError, check_auth_settings
from sie.gateway.lane_depth import LaneDepths, ReadDepth, known_lanes
from sie.gateway.pools import PoolDirectory
from sie.gateway.scaling import LaneSignals
from sie.gateway.status import ModelStatusSource
from sie.http.handlers import plain_handler_routes
from sie.http.serving import HttpListener
from sie.ipc.sockets import SocketPathError
from sie.pools import DemandTracker, KeyValue, KeyValuePoolStore, MemoryPoolStore, PoolStore
from sie.runtime import run_event_loop
from sie.settings import Settings
from sie.telemetry.exposition import METRICS_PATH, ChildSource, MetricsEndpoint
from sie.telemetry.gateway import GatewayMetrics
from sie.telemetry.logs import configure_logging
from sie.telemetry.metrics import ModelLabels, Telemetry
from sie.telemetry.tracing import Tracing
from sie.telemetry.worker import WorkerMetrics
from sie.worker.devices import CPU, Device, DeviceError, load_cuda_libraries, memory_budget, resolve_devices
from sie.worker.errors import ModelLoadError
from sie.worker.loading import ModelLoader
from sie.worker.manager import ModelManager
from sie.worker.null_backend import NullWorkerService
from sie.worker.runner import BatchRunner
from sie.worker.service import WorkerService

logger = logging.getLogger(__name__)

RoleMain = Callable[[Settings], Coroutine[Any, Any, None]]


class RoleSetupError(Exception):
    """Settings that parse but cannot work together in this role; the CLI prints the message and exits 2."""


def run_main(main: RoleMain, settings: Settings) -> int:
    """Log as configured and run `main(settings)` on the event loop SIE_EVENT_LOOP names; exit status 0, or 2
    with one line on stderr when the host lacks the devices SIE_WORKER_DEVICES asks for or the worker's socket
    path is taken."""
    configure_logging(settings.telemetry)
    try:
        run_event_loop(main(settings), settings.process.event_loop)
    except (DeviceError, SocketPathError, RoleSetupError) as exc:
        print(f"sie: {exc}", file=sys.stderr)
        return 2
    return 0


def run_gateway_main(main: RoleMain, settings: Settings) -> int:
    """`run_main` for the roles that serve the gateway; exit status 2, before anything starts, when the auth
    settings cannot be served (token mode without an inference token, an unreadable tokens file)."""
    try:
        check_auth_settings(settings.auth)
    except AuthSettingsError as exc:
        print(f"sie: {exc}", file=sys.stderr)
        return 2
    return run_main(main, settings)


def baseline_catalog(settings: Settings) -> Catalog:
    """The filesystem catalogue (SIE_BUNDLES_DIR, SIE_MODELS_DIR) a role starts from."""
    return load_catalog(settings.catalog.bundles_dir, settings.catalog.models_dir)


def open_tracing(stack: AsyncExitStack, settings: Settings, service_name: str) -> Tracing:
    """This process's tracing (SIE_TRACING_ENABLED), named `service_name` unless OTEL_SERVICE_NAME says otherwise.
    Enter it first: `stack` closes it last, flushing queued spans for a bounded time off the event loop."""
    tracing = Tracing.from_settings(settings.tracing, settings.telemetry, service_name)
    stack.push_async_callback(asyncio.to_thread, tracing.close)
    return tracing


def open_telemetry(
    stack: AsyncExitStack, settings: Settings, service_name: str, attributes: Mapping[str, str] | None = None
) -> Telemetry:
    """This process's metrics (SIE_METRICS_ENABLED; pushed over OTLP when an endpoint is set), named `service_name`
    unless OTEL_SERVICE_NAME says otherwise. `stack` pushes the last values at exit, off the event loop."""
    telemetry = Telemetry(service_name, settings.telemetry, attributes)
    stack.push_async_callback(asyncio.to_thread, telemetry.shutdown)
    return telemetry


def metrics_routes(telemetry: Telemetry, children: Callable[[], Iterable[ChildSource]] | None = None) -> list[Route]:
    """`GET /metrics` for a starlette app: `telemetry`'s series, then the worker children's."""
    return plain_handler_routes(MetricsEndpoint(telemetry, children).handle, [METRICS_PATH])


def catalogue_labels(catalog: Callable[[], Catalog]) -> ModelLabels:
    """Model labels bounded by the current catalogue: its ids, `other` for any id it does not know."""

    def catalogue_id(model_id: str) -> str | None:
        entry = catalog().find(model_id)
        return entry.model_id if entry is not None else None

    return ModelLabels(catalogue_id)


def pool_store(settings: Settings, bucket: KeyValue | None) -> PoolStore:
    """Where the gateway keeps pools (SIE_POOL_STORE): the broker's KV `bucket` (every replica shares it) or this
    process's memory; `auto` takes the bucket when the role has a broker."""
    choice = settings.pools.store
    if choice == "nats" and bucket is None:
        raise RoleSetupError("SIE_POOL_STORE=nats needs a NATS broker, and this role has none (use memory or auto)")
    if choice == "memory" or bucket is None:
        return MemoryPoolStore()
    return KeyValuePoolStore(bucket)


@attrs.frozen
class GatewayPools:
    """The gateway's pools and the per-lane scale signals built on them."""

    directory: PoolDirectory
    signals: LaneSignals


async def open_gateway_pools(
    stack: AsyncExitStack,
    settings: Settings,
    store: PoolStore,
    status: ModelStatusSource,
    read_depth: ReadDepth,
    catalog: Callable[[], Catalog],
) -> GatewayPools:
    """The pool directory over `store` and the lane signals (pending demand, warm floors, and the queue depths of
    the default lane, the workers' lanes and every lane with demand or a floor), refreshed in the background until
    `stack` closes."""
    pools = settings.pools
    directory = await stack.enter_async_context(
        PoolDirectory(store, pools.static_queue_pools, pools.default_ttl_s, status.workers, catalog=catalog)
    )
    signals = LaneSignals(
        DemandTracker(pools.demand_ttl_s), directory.warm_floors, status.workers, directory.pinned_models_loaded
    )
    lanes = known_lanes(status, settings.lane, lambda: [*signals.pending_demand(), *signals.warm_floors()])
    await stack.enter_async_context(LaneDepths(read_depth, lanes, signals.set_depths))
    return GatewayPools(directory, signals)


def open_gateway_metrics(
    telemetry: Telemetry, catalog: Callable[[], Catalog], lanes: LaneSignals
) -> GatewayMetrics | None:
    """The gateway's series on `telemetry` (None while metrics are off), model labels bounded by `catalog`, lane
    values read from `lanes`."""
    if not telemetry.enabled:
        return None
    return GatewayMetrics(telemetry.meter, catalogue_labels(catalog), lanes)


def http_listener(host: str, port: int, settings: Settings) -> HttpListener:
    """Where and how a role serves HTTP: its bind, SIE_SHUTDOWN_GRACE_S to drain, SIE_HTTP_SERVER."""
    return HttpListener(host, port, settings.process.shutdown_grace_s, settings.process.http_server)


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
    and SIE_PRELOAD_MODELS loaded; their batches are spans of `tracing`. Raises DeviceError when the host lacks
    the devices asked for."""
    devices = resolve_devices(settings.worker.devices) if devices is None else devices
    cpu_children = sum(1 for device in devices if device.kind == CPU)
    if cpu_children < len(devices):
        load_cuda_libraries()
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
        service = NullWorkerService(catalog, worker_id, batching.max_batch_items, device)
        return LocalWorker(service, manager, name, device)
    runner = BatchRunner(manager, infer_pool, tracing)
    service = WorkerService(manager, runner, worker_id, settings.lane, batching, device, tracing)
    return LocalWorker(service, manager, name, device)


def _one_thread(stack: AsyncExitStack, name: str) -> ThreadPoolExecutor:
    """A one-thread executor, shut down (after its running call ends) when `stack` closes."""
    pool = ThreadPoolExecutor(1, thread_name_prefix=name)
    stack.push_async_callback(asyncio.to_thread, pool.shutdown)
    return pool
