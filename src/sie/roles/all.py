"""`sie run --role all`: gateway, sidecar and worker in one process. The loopback transport replaces
NATS and the sidecar calls the worker service directly; the code above those seams is the same as in
the distributed roles (DESIGN.md §4).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack

import attrs

from sie.catalog import load_catalog
from sie.gateway.app import build_gateway_app, serving_state
from sie.roles.common import default_intra_op_threads, preload, stream_settings
from sie.roles.local_status import LocalModelStatus
from sie.roles.serving import hypercorn_config, serve_until_signalled
from sie.settings import Settings
from sie.sidecar import Sidecar
from sie.telemetry.logs import configure_logging
from sie.transport.loopback import LoopbackTransport
from sie.worker.loading import ModelLoader
from sie.worker.manager import ModelManager
from sie.worker.null_backend import NullWorkerService
from sie.worker.runner import BatchRunner
from sie.worker.service import WorkerService

logger = logging.getLogger(__name__)


async def serve_all(settings: Settings) -> None:
    worker_settings = settings.worker
    if worker_settings.intra_op_threads is None:
        worker_settings = attrs.evolve(worker_settings, intra_op_threads=default_intra_op_threads())
    catalog = load_catalog(settings.catalog.bundles_dir, settings.catalog.models_dir)
    loader = ModelLoader.from_settings(worker_settings)
    with (
        ThreadPoolExecutor(1, thread_name_prefix="sie-load") as load_pool,
        ThreadPoolExecutor(1, thread_name_prefix="sie-infer") as infer_pool,
    ):
        async with AsyncExitStack() as stack:
            manager = await stack.enter_async_context(
                ModelManager(
                    catalog,
                    loader.load,
                    load_pool,
                    worker_settings.memory_budget_bytes,
                    worker_settings.max_loaded_models,
                )
            )
            manager.pin(worker_settings.preload_models)
            worker = (
                NullWorkerService(catalog, settings.process.worker_id, settings.batching.max_batch_items)
                if worker_settings.backend == "null"
                else WorkerService(
                    manager, BatchRunner(manager, infer_pool), settings.process.worker_id, settings.lane,
                    settings.batching,
                )
            )  # fmt: skip
            transport = await stack.enter_async_context(LoopbackTransport(stream_settings(settings)))
            sidecar = await stack.enter_async_context(Sidecar.from_settings(transport, worker, settings))
            await preload(manager, worker_settings.preload_models)
            app = build_gateway_app(
                lambda: manager.catalog, transport, LocalModelStatus(manager, settings), settings.gateway,
                router_id=settings.process.router_id, lane=settings.lane,
            )  # fmt: skip
            grace = settings.process.shutdown_grace_s

            async def drain() -> None:
                await serving_state(app).drain(grace)
                await sidecar.drain(grace)

            config = hypercorn_config(settings.gateway.host, settings.gateway.port, grace)
            await serve_until_signalled(app, config, drain)


def run(settings: Settings) -> int:
    configure_logging(settings.telemetry)
    asyncio.run(serve_all(settings))
    return 0
