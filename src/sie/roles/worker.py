"""`sie run --role worker`: the model backend behind the IPC server on `SIE_IPC_SOCKET_PATH`; it never
touches NATS. The sidecar in the same pod dials the socket.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack

import attrs

from sie.catalog import load_catalog
from sie.ipc.server import IpcServer
from sie.roles.common import default_intra_op_threads, preload, wait_for_signal
from sie.settings import Settings
from sie.telemetry.logs import configure_logging
from sie.worker.loading import ModelLoader
from sie.worker.manager import ModelManager
from sie.worker.null_backend import NullWorkerService
from sie.worker.runner import BatchRunner
from sie.worker.service import WorkerService

logger = logging.getLogger(__name__)


async def serve_worker(settings: Settings) -> None:
    worker_settings = settings.worker
    if worker_settings.intra_op_threads is None:
        worker_settings = attrs.evolve(worker_settings, intra_op_threads=default_intra_op_threads())
    catalog = load_catalog(settings.catalog.bundles_dir, settings.catalog.models_dir)
    worker_id = settings.process.worker_id
    with (
        ThreadPoolExecutor(1, thread_name_prefix="sie-load") as load_pool,
        ThreadPoolExecutor(1, thread_name_prefix="sie-infer") as infer_pool,
    ):
        async with AsyncExitStack() as stack:
            if worker_settings.backend == "null":
                service = NullWorkerService(catalog, worker_id, settings.batching.max_batch_items)
            else:
                loader = ModelLoader.from_settings(worker_settings)
                manager = await stack.enter_async_context(
                    ModelManager(
                        catalog,
                        loader.load,
                        load_pool,
                        worker_settings.memory_budget_bytes,
                        worker_settings.max_loaded_models,
                    )  # fmt: skip
                )
                manager.pin(worker_settings.preload_models)
                runner = BatchRunner(manager, infer_pool)
                service = WorkerService(manager, runner, worker_id, settings.lane, settings.batching)
                await preload(manager, worker_settings.preload_models)
            await stack.enter_async_context(IpcServer(service, worker_settings.socket_path, worker_id=worker_id))
            logger.info("worker %s serving IPC on %s", worker_id, worker_settings.socket_path)
            await wait_for_signal()
            logger.info("worker %s shutting down", worker_id)


def run(settings: Settings) -> int:
    configure_logging(settings.telemetry)
    asyncio.run(serve_worker(settings))
    return 0
