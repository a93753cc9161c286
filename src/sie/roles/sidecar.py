"""`sie run --role sidecar`: consume one lane from NATS JetStream and serve it with the pod's worker children
on their Unix sockets (`SIE_IPC_SOCKET_PATH` for one worker, `SIE_IPC_SOCKET_PATH.{i}` for several), each batch
placed by the fleet (SIE_PLACEMENT_*); heartbeats on `sie.health.{worker_id}`; probes, the placement surface
and `/metrics` on SIE_WORKER_PROBE_HOST:PORT; live config deltas from `sie.config.models.{bundle}` forwarded to
every child, and the config export reconciled when SIE_CONFIG_SERVICE_URL is set. NATS is connected in the
background: while it is unreachable the probes answer (`/readyz` 503: no heartbeat goes out) and the lane consumer
attaches once it connects. With SIE_LOCAL_INGEST_SOCKET the sidecar also serves that socket to co-located producers.
"""

from __future__ import annotations

import functools
import logging
from contextlib import AsyncExitStack

from sie.http.plain import first_answer
from sie.ipc.uds_client import UdsWorkerClient
from sie.placement.api import PlacementApi
from sie.placement.metrics import PlacementCollector
from sie.roles.serving import open_telemetry, open_tracing, run_main
from sie.runtime import freeze_startup_heap, wait_for_signal
from sie.settings import Settings
from sie.sidecar import Sidecar, WorkerHooks
from sie.sidecar.live_config import LiveConfig
from sie.sidecar.pod.children import SocketChildren
from sie.sidecar.pod.fleet import WorkerFleet
from sie.sidecar.pod.health import HealthPublisher
from sie.sidecar.pod.probes import ProbeServer
from sie.telemetry.exposition import MetricsEndpoint
from sie.telemetry.sidecar import SidecarMetrics
from sie.transport.nats import NatsTransport
from sie.transport.reconnecting import ReconnectingTransport

logger = logging.getLogger(__name__)


async def serve_sidecar(settings: Settings) -> None:
    worker_id, probes = settings.process.worker_id, settings.sidecar
    async with AsyncExitStack() as stack:
        tracing = open_tracing(stack, settings, "sie-sidecar")
        telemetry = open_telemetry(stack, settings, "sie-sidecar")
        metrics = SidecarMetrics(telemetry) if telemetry.enabled else None
        nats, streams, name = settings.nats, settings.stream, f"sie-sidecar-{worker_id}"
        transport = await stack.enter_async_context(
            ReconnectingTransport(lambda: NatsTransport(nats, streams, name=name), description=f"NATS at {nats.url}")
        )
        telemetry.observe_connection(lambda: transport.unavailable_reason() is None)
        children = SocketChildren(settings.worker.socket_path, functools.partial(UdsWorkerClient, metrics=metrics))
        worker = await stack.enter_async_context(WorkerFleet.from_settings(children, settings.placement))
        telemetry.register(PlacementCollector(worker.snapshot))
        # `/metrics`: this sidecar's series, placement's, then each worker child's labelled with its name and device.
        routes = first_answer(MetricsEndpoint(telemetry, worker.metric_sources).handle, PlacementApi(worker).handle)
        # Live config owns the acknowledged state: deltas and export reconciliation advance it, heartbeats advertise it.
        live = await stack.enter_async_context(LiveConfig(transport, worker, settings))
        health = await stack.enter_async_context(HealthPublisher.from_settings(transport, worker, settings, live))
        server = await stack.enter_async_context(
            ProbeServer(lambda: health.ready, probes.probe_port, host=probes.probe_host, routes=routes)
        )
        hooks = WorkerHooks(observe=health.observe, replicas=worker.replicas)
        sidecar = Sidecar.from_settings(transport, worker, settings, hooks, tracing, metrics)
        freeze_startup_heap()  # before consuming: its full collection must not pause live work
        await stack.enter_async_context(sidecar)
        logger.info("sidecar %s consuming %s; probes on %s:%d", worker_id, sidecar.lane, probes.probe_host, server.port)
        await wait_for_signal()
        logger.info("sidecar %s draining", worker_id)
        health.begin_drain()
        await sidecar.drain(settings.process.shutdown_grace_s)


def run(settings: Settings) -> int:
    return run_main(serve_sidecar, settings)
