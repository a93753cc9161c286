"""`sie run --role all`: gateway, sidecar and worker in one process. The loopback transport replaces
NATS and the sidecar calls the worker service directly; the code above those seams is the same as in
the distributed roles (DESIGN.md §4).
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack

from sie.catalog import load_catalog
from sie.gateway.app import build_gateway_app, serving_state
from sie.roles.common import (
    freeze_startup_heap,
    open_local_worker,
    preload,
    run_event_loop,
    worker_pools,
)
from sie.roles.local_status import LocalModelStatus
from sie.roles.serving import HttpListener, serve_until_signalled
from sie.settings import Settings
from sie.sidecar import Sidecar
from sie.telemetry.logs import configure_logging
from sie.transport.loopback import LoopbackTransport

logger = logging.getLogger(__name__)


async def serve_all(settings: Settings) -> None:
    catalog = load_catalog(settings.catalog.bundles_dir, settings.catalog.models_dir)
    with worker_pools() as pools:
        async with AsyncExitStack() as stack:
            local = await open_local_worker(stack, settings, catalog, pools)
            manager = local.manager
            worker = local.service
            transport = await stack.enter_async_context(LoopbackTransport(settings.stream))
            sidecar = await stack.enter_async_context(Sidecar.from_settings(transport, worker, settings))
            await preload(manager, settings.worker.preload_models)
            app = build_gateway_app(
                lambda: manager.catalog, transport, LocalModelStatus(manager, settings), settings.gateway,
                router_id=settings.process.router_id, lane=settings.lane,
            )  # fmt: skip
            grace = settings.process.shutdown_grace_s

            async def drain() -> None:
                await serving_state(app).drain(grace)
                await sidecar.drain(grace)

            listener = HttpListener(settings.gateway.host, settings.gateway.port, grace, settings.process.http_server)
            freeze_startup_heap()
            await serve_until_signalled(app, listener, drain)


def run(settings: Settings) -> int:
    configure_logging(settings.telemetry)
    run_event_loop(serve_all(settings), settings)
    return 0
