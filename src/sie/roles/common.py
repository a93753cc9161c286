"""Wiring the role files share: running a role's main coroutine, the baseline catalogue, each role's HTTP
listener, and the local worker (model manager + worker service) with its threads and preloaded models."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, contextmanager
from typing import Any

import attrs

from sie.catalog import Catalog, load_catalog
from sie.gateway.auth import GatewayAuthUnavailable, refuse_unbuilt_auth
from sie.http.serving import HttpListener
from sie.runtime import default_intra_op_threads, run_event_loop
from sie.settings import Settings
from sie.telemetry.logs import configure_logging
from sie.worker.errors import ModelLoadError
from sie.worker.loading import ModelLoader
from sie.worker.manager import ModelManager
from sie.worker.null_backend import NullWorkerService
from sie.worker.runner import BatchRunner
from sie.worker.service import WorkerService

logger = logging.getLogger(__name__)

RoleMain = Callable[[Settings], Coroutine[Any, Any, None]]


def run_main(main: RoleMain, settings: Settings) -> int:
    """Log as configured and run `main(settings)` on the event loop SIE_EVENT_LOOP names; exit status 0."""
    configure_logging(settings.telemetry)
    run_event_loop(main(settings), settings.process.event_loop)
    return 0


def run_gateway_main(main: RoleMain, settings: Settings) -> int:
    """`run_main` for the roles that serve the gateway; exit status 2 while the settings ask for gateway
    auth, which this version cannot enforce (fail closed, never open)."""
    try:
        refuse_unbuilt_auth(settings.auth)
    except GatewayAuthUnavailable as exc:
        print(f"sie: {exc}", file=sys.stderr)
        return 2
    return run_main(main, settings)


def baseline_catalog(settings: Settings) -> Catalog:
    """The filesystem catalogue (SIE_BUNDLES_DIR, SIE_MODELS_DIR) a role starts from."""
    return load_catalog(settings.catalog.bundles_dir, settings.catalog.models_dir)


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
    """The worker of this process: the service the sidecar calls and the manager behind it."""

    service: WorkerService | NullWorkerService
    manager: ModelManager


@contextmanager
def worker_pools() -> Iterator[tuple[ThreadPoolExecutor, ThreadPoolExecutor]]:
    """One thread that loads models and one that runs them (onnxruntime parallelises inside a run)."""
    with (
        ThreadPoolExecutor(1, thread_name_prefix="sie-load") as load_pool,
        ThreadPoolExecutor(1, thread_name_prefix="sie-infer") as infer_pool,
    ):
        yield load_pool, infer_pool


async def open_local_worker(
    stack: AsyncExitStack, settings: Settings, catalog: Catalog, pools: tuple[ThreadPoolExecutor, ThreadPoolExecutor]
) -> LocalWorker:
    """Build the model manager (entered on `stack`), pin and preload SIE_PRELOAD_MODELS, and the worker
    service (ONNX or null backend, SIE_WORKER_BACKEND)."""
    worker = settings.worker
    if worker.intra_op_threads is None:
        worker = attrs.evolve(worker, intra_op_threads=default_intra_op_threads())
    load_pool, infer_pool = pools
    loader = ModelLoader.from_settings(worker)
    manager = await stack.enter_async_context(
        ModelManager(catalog, loader.load, load_pool, worker.memory_budget_bytes, worker.max_loaded_models)
    )
    manager.pin(worker.preload_models)
    await preload(manager, worker.preload_models)
    worker_id = settings.process.worker_id
    if worker.backend == "null":
        return LocalWorker(NullWorkerService(catalog, worker_id, settings.batching.max_batch_items), manager)
    runner = BatchRunner(manager, infer_pool)
    return LocalWorker(WorkerService(manager, runner, worker_id, settings.lane, settings.batching), manager)
