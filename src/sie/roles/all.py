"""`sie run --role all`: gateway, sidecar and worker in one process. The loopback transport replaces
NATS and the sidecar calls the worker service directly; the code above those seams is the same as in
the distributed roles (DESIGN.md §4).
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from sie.gateway.app import GatewaySources, build_gateway_app, serving_state
from sie.http.serving import serve_until_signalled
from sie.roles.common import baseline_catalog, http_listener, open_local_workers, run_gateway_main
from sie.roles.local_status import LocalModelStatus
from sie.runtime import freeze_startup_heap
from sie.settings import Settings
from sie.sidecar import Sidecar
from sie.transport.loopback import LoopbackTransport


async def serve_all(settings: Settings) -> None:
    catalog = baseline_catalog(settings)
    async with AsyncExitStack() as stack:
        local = (await open_local_workers(stack, settings, catalog))[0]  # the fleet fronts them all next
        transport = await stack.enter_async_context(LoopbackTransport(settings.stream))
        sidecar = await stack.enter_async_context(Sidecar.from_settings(transport, local.service, settings))
        manager = local.manager
        status = LocalModelStatus(manager, settings.process.worker_id, settings.lane)
        sources = GatewaySources(lambda: manager.catalog, transport, transport, status)
        app = build_gateway_app(sources, settings.gateway, settings.lane, settings.process.router_id)
        grace = settings.process.shutdown_grace_s

        async def drain() -> None:
            await serving_state(app).drain(grace)
            await sidecar.drain(grace)

        listener = http_listener(settings.gateway.host, settings.gateway.port, settings)
        freeze_startup_heap()
        await serve_until_signalled(app, listener, drain)


def run(settings: Settings) -> int:
    return run_gateway_main(serve_all, settings)
