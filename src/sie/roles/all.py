"""`sie run --role all`: gateway, sidecar and worker children in one process. The loopback transport replaces
NATS and the sidecar calls the worker children's services directly, one per device of SIE_WORKER_DEVICES,
through the fleet that places each batch (SIE_PLACEMENT_*); the code above those seams is the same as in the
distributed roles (DESIGN.md §4). The placement surface and `/metrics` are served beside the API, on 127.0.0.1
unless SIE_GATEWAY_HOST (`--host`) says otherwise: a laptop's server is for this machine only. With
SIE_LOCAL_INGEST_SOCKET the sidecar also takes work from co-located producers on that socket, without HTTP.

The config service runs in the process too: its writes (`POST`/`PUT`/`DELETE /v1/configs/models…`, what `sie config`
sends) are served on the same port with the same validation, epoch, store (SIE_CONFIG_STORE_DIR) and admin auth,
and reach the worker children as they reach a distributed worker: deltas on the in-process bus, and the export
(its epoch polled through the app itself) for deletions and for the models a store restores at start.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import httpx

from sie.control.http.app import build_control_app, write_routes
from sie.control.publisher import DeltaPublisher
from sie.control.writes import ConfigWriter
from sie.gateway.dead_letters import DeadLetterQueue
from sie.gateway.http.app import GatewaySources, build_gateway_app, serving_state
from sie.gateway.http.auth import GatewayAuth
from sie.gateway.publisher import QueueConsumers
from sie.http.handlers import plain_handler_routes
from sie.http.serving import serve_until_signalled
from sie.placement.api import PLACEMENT_PATH, PlacementApi
from sie.placement.metrics import PlacementCollector
from sie.roles.config import access_policy, config_router_id, open_state
from sie.roles.gateway_parts import open_gateway_metrics, open_gateway_pools, pool_store, run_gateway_main
from sie.roles.local_workers import LocalModelStatus, open_local_workers
from sie.roles.serving import baseline_catalog, http_listener, metrics_routes, open_telemetry, open_tracing
from sie.runtime import freeze_startup_heap
from sie.settings import Settings
from sie.settings.gateway import LOOPBACK_HOST
from sie.sidecar import Sidecar, WorkerHooks
from sie.sidecar.live_config import LiveConfig
from sie.sidecar.pod.children import LocalChildren
from sie.sidecar.pod.fleet import WorkerFleet
from sie.telemetry.gateway import StoreMetrics
from sie.telemetry.sidecar import SidecarMetrics
from sie.transport.loopback import LoopbackTransport


async def serve_all(settings: Settings) -> None:
    catalog = baseline_catalog(settings)
    config_store, registry, epoch = await open_state(settings)
    async with AsyncExitStack() as stack:
        tracing = open_tracing(stack, settings, "sie-all")  # one process: gateway, sidecar and worker spans
        telemetry = open_telemetry(stack, settings, "sie-all")  # gateway and sidecar series; each child has its own
        workers = await open_local_workers(stack, settings, catalog, tracing=tracing)
        manager = workers[0].manager  # every child serves the same catalogue
        children = LocalChildren({worker.name: worker.service for worker in workers})
        fleet = await stack.enter_async_context(WorkerFleet.from_settings(children, settings.placement))
        telemetry.register(PlacementCollector(fleet.snapshot))
        transport = await stack.enter_async_context(LoopbackTransport(settings.stream))
        stores = StoreMetrics(telemetry) if telemetry.enabled else None
        dead_letters = await stack.enter_async_context(
            DeadLetterQueue(transport, settings.gateway.request_timeout_s, metrics=stores)
        )
        # The config service in process: writes publish deltas on the loopback bus; the workers' live config takes
        # them, and reconciles from the export (deletions, restored models) read through the app itself.
        writer = ConfigWriter(
            registry, config_store, DeltaPublisher(transport), router_id=config_router_id(settings), epoch=epoch
        )
        control = build_control_app(writer, registry, access_policy(settings), access_log=False)
        config_client = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=control), base_url="http://config")
        )
        await stack.enter_async_context(LiveConfig(transport, fleet, settings, http=config_client))
        sidecar_metrics = SidecarMetrics(telemetry) if telemetry.enabled else None
        sidecar = await stack.enter_async_context(
            Sidecar.from_settings(transport, fleet, settings, WorkerHooks(replicas=fleet.replicas), tracing,
                                  sidecar_metrics)
        )  # fmt: skip
        status = LocalModelStatus(workers, settings.lane)
        store = pool_store(settings, None)
        pools = await open_gateway_pools(stack, settings, store, status, transport.lane_depth, lambda: manager.catalog)
        metrics = open_gateway_metrics(telemetry, lambda: manager.catalog, pools.signals)
        auth = await stack.enter_async_context(GatewayAuth.from_settings(settings.auth))
        sources = GatewaySources(
            lambda: manager.catalog, transport, QueueConsumers(transport), status, dead_letters=dead_letters, auth=auth,
            tracing=tracing, metrics=metrics, pools=pools.directory, signals=pools.signals,
        )  # fmt: skip
        routes = [
            *write_routes(control.state.handlers),
            *plain_handler_routes(PlacementApi(fleet).handle, [PLACEMENT_PATH]),
            *metrics_routes(telemetry, fleet.metric_sources),
        ]
        host = settings.gateway.host or LOOPBACK_HOST
        app = build_gateway_app(
            sources, settings.gateway, settings.lane, settings.process.router_id, routes, settings.pools, host
        )
        grace = settings.process.shutdown_grace_s

        async def drain() -> None:
            await serving_state(app).drain(grace)
            await sidecar.drain(grace)

        listener = http_listener(host, settings.gateway.port, settings)
        freeze_startup_heap()
        await serve_until_signalled(app, listener, drain)


def run(settings: Settings) -> int:
    return run_gateway_main(serve_all, settings)
