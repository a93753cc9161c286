"""`sie run --role sidecar`: consume one lane from NATS JetStream and serve it with the worker on the
Unix socket; heartbeats on `sie.health.{worker_id}`, probes on `SIE_WORKER_PROBE_PORT`, live config
deltas from `sie.config.models.{bundle}` forwarded to the worker, and the config export reconciled
when `SIE_CONFIG_SERVICE_URL` is set.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack

from sie.ipc.uds_client import UdsWorkerClient
from sie.roles.common import freeze_startup_heap, run_event_loop, wait_for_signal
from sie.settings import Settings
from sie.sidecar import Sidecar
from sie.sidecar.config_apply import AppliedConfig, ConfigApplier
from sie.sidecar.config_export import ExportReconciler
from sie.sidecar.health import HealthPublisher
from sie.sidecar.probes import ProbeServer
from sie.telemetry.logs import configure_logging
from sie.transport.nats import NatsTransport

logger = logging.getLogger(__name__)


async def serve_sidecar(settings: Settings) -> None:
    worker_id = settings.process.worker_id
    async with AsyncExitStack() as stack:
        transport = await stack.enter_async_context(
            NatsTransport(settings.nats, settings.stream, name=f"sie-sidecar-{worker_id}")
        )
        worker = await stack.enter_async_context(UdsWorkerClient(settings.worker.socket_path))
        applied = AppliedConfig()  # shared: deltas and export reconciliation advance one acknowledged state
        health = HealthPublisher.from_settings(transport, worker, settings)
        health.acknowledged_hash = lambda: applied.bundle_config_hash
        await stack.enter_async_context(health)
        probes = await stack.enter_async_context(ProbeServer(lambda: health.ready, settings.sidecar.probe_port))
        await stack.enter_async_context(ConfigApplier(transport, worker, settings, applied))
        await stack.enter_async_context(ExportReconciler(worker, settings, applied))
        sidecar = Sidecar.from_settings(transport, worker, settings)
        sidecar.on_readiness_answer = health.observe
        freeze_startup_heap()  # before consuming: its full collection must not pause live work
        await stack.enter_async_context(sidecar)
        logger.info("sidecar %s consuming %s; probes on port %d", worker_id, sidecar.lane, probes.port)
        await wait_for_signal()
        logger.info("sidecar %s draining", worker_id)
        health.begin_drain()
        await sidecar.drain(settings.process.shutdown_grace_s)


def run(settings: Settings) -> int:
    configure_logging(settings.telemetry)
    run_event_loop(serve_sidecar(settings), settings)
    return 0
