"""`sie run --role gateway`: the HTTP inference API publishing to NATS JetStream lanes and collecting
results on `_INBOX.{router_id}.>`; workers known from `sie.health.>` heartbeats; model config from the
filesystem seed, then kept in step with the config service (bootstrap, epoch poll, live deltas).
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from sie.catalog import load_catalog
from sie.gateway.app import build_gateway_app, serving_state
from sie.gateway.config_sync import ConfigState, ConfigSync
from sie.gateway.registry import RegistryGatedQueue, WorkerRegistry
from sie.roles.common import freeze_startup_heap, run_event_loop
from sie.roles.serving import HttpListener, serve_until_signalled
from sie.settings import Settings
from sie.telemetry.logs import configure_logging
from sie.telemetry.metrics import Telemetry
from sie.transport.nats import NatsTransport


async def serve_gateway(settings: Settings) -> None:
    catalog = load_catalog(settings.catalog.bundles_dir, settings.catalog.models_dir)
    state = ConfigState(catalog, telemetry=Telemetry(service_name="sie-gateway"))
    router_id = settings.process.router_id
    async with AsyncExitStack() as stack:
        transport = await stack.enter_async_context(
            NatsTransport(settings.nats, settings.stream, name=f"sie-gateway-{router_id}")
        )
        registry = await stack.enter_async_context(WorkerRegistry.from_settings(transport, settings))
        await stack.enter_async_context(ConfigSync(state, transport, settings.config_sync, settings.auth.admin_token))
        app = build_gateway_app(
            state, RegistryGatedQueue(transport, registry), registry, settings.gateway,
            router_id=router_id, lane=settings.lane,
        )  # fmt: skip
        grace = settings.process.shutdown_grace_s

        async def drain() -> None:
            await serving_state(app).drain(grace)

        listener = HttpListener(settings.gateway.host, settings.gateway.port, grace, settings.process.http_server)
        freeze_startup_heap()
        await serve_until_signalled(app, listener, drain)


def run(settings: Settings) -> int:
    configure_logging(settings.telemetry)
    run_event_loop(serve_gateway(settings), settings)
    return 0
