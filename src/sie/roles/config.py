"""`sie run --role config`: the config service. Settings → config store → registry (filesystem baseline,
stored models restored) → stored epoch → optional NATS publisher → app → HTTP server (seed 000 §3, §13).

Router id: gateways trust producers named `sie-config` exactly or as a pod-name prefix, so the service
uses SIE_ROUTER_ID only when it starts with `sie-config`, else `sie-config`. Without SIE_NATS_URL there is
no publisher and writes answer `router_id: "standalone"`. With it, the service starts even while NATS is
unreachable: it connects in the background and refuses writes with 503 until connected. Without
SIE_CONFIG_STORE_DIR the store is in memory: writes and the epoch work but do not survive a restart.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from contextlib import AsyncExitStack

from sie.control.auth import AccessPolicy
from sie.control.errors import UnrestoredStoreError
from sie.control.http.app import build_control_app
from sie.control.loading import load_registry, require_no_stored_models, restore_models
from sie.control.publisher import DeltaPublisher
from sie.control.registry import ModelRegistry
from sie.control.writes import ConfigWriter
from sie.http.serving import serve_until_signalled
from sie.roles.serving import http_listener, metrics_routes, open_telemetry, run_main
from sie.runtime import freeze_startup_heap
from sie.settings import Settings
from sie.stores.config_store import ConfigStore, ConfigStoreError, CorruptEpochError
from sie.stores.fsspec_store import open_config_store
from sie.telemetry.http import HttpMetrics
from sie.telemetry.metrics import ModelLabels, Telemetry
from sie.transport.base import TransportUnavailable
from sie.transport.reconnecting import ReconnectingTransport

logger = logging.getLogger(__name__)
TRUSTED_PRODUCER = "sie-config"


def config_router_id(settings: Settings) -> str:
    """The producer id on config deltas: SIE_ROUTER_ID when gateways would trust it, else `sie-config`."""
    router_id = settings.process.router_id
    return router_id if router_id.startswith(TRUSTED_PRODUCER) else TRUSTED_PRODUCER


def access_policy(settings: Settings) -> AccessPolicy:
    auth = settings.auth
    return AccessPolicy(
        admin_token=auth.admin_token,
        read_tokens=auth.config_read_tokens,
        auth_tokens=auth.tokens,
        production=settings.process.deployment_env.strip().lower() == "prod",
    )


async def open_state(settings: Settings) -> tuple[ConfigStore, ModelRegistry, int]:
    """The store, the loaded registry with the stored models, and the stored epoch; CorruptEpochError and
    UnrestoredStoreError (SIE_CONFIG_RESTORE=false over stored models) stop start-up."""
    store = await asyncio.to_thread(open_config_store, settings.config_service.store_dir)
    catalog = settings.catalog
    registry = await asyncio.to_thread(load_registry, catalog.bundles_dir, catalog.models_dir)
    epoch = await asyncio.to_thread(store.read_epoch)
    if not settings.config_service.restore:
        await asyncio.to_thread(require_no_stored_models, store)
    elif registry.available:
        restored = await asyncio.to_thread(restore_models, registry, store)
        logger.info("restored %d models from the config store at epoch %d", restored, epoch)
    return store, registry, epoch


async def open_publisher(settings: Settings, stack: AsyncExitStack, telemetry: Telemetry) -> DeltaPublisher | None:
    if not settings.nats.url:
        logger.info("SIE_NATS_URL is unset: config deltas are not published (router_id 'standalone')")
        return None
    from sie.transport.nats import NatsTransport  # not imported by `sie run --role all`, which never dials NATS

    nats, streams, name = settings.nats, settings.stream, f"sie-config-{config_router_id(settings)}"
    # Connects in the background: an unreachable broker blocks writes with 503, never start-up (seed 000 §13).
    bus = ReconnectingTransport(lambda: NatsTransport(nats, streams, name=name), description=f"NATS at {nats.url}")
    telemetry.observe_connection(lambda: bus.unavailable_reason() is None)
    return DeltaPublisher(await stack.enter_async_context(bus))


def request_metrics(telemetry: Telemetry, registry: ModelRegistry) -> HttpMetrics | None:
    """The config service's request series (None while metrics are off); model labels are the registry's ids."""

    def registry_id(model_id: str) -> str | None:
        model = registry.state.find_model(model_id) if registry.available else None
        return model.sie_id if model is not None else None

    return HttpMetrics(telemetry, "sie.config", ModelLabels(registry_id)) if telemetry.enabled else None


async def serve_config(settings: Settings) -> None:
    store, registry, epoch = await open_state(settings)
    async with AsyncExitStack() as stack:
        telemetry = open_telemetry(stack, settings, "sie-config")
        publisher = await open_publisher(settings, stack, telemetry)
        writer = ConfigWriter(registry, store, publisher, router_id=config_router_id(settings), epoch=epoch)
        app = build_control_app(
            writer,
            registry,
            access_policy(settings),
            metrics=request_metrics(telemetry, registry),
            extra_routes=metrics_routes(telemetry),
        )
        service = settings.config_service
        listener = http_listener(service.host, service.port, settings)
        freeze_startup_heap()
        await serve_until_signalled(app, listener, _nothing_to_drain)


async def _nothing_to_drain() -> None:
    """Writes finish under the HTTP server's graceful timeout; there is no background work to drain."""


def run(settings: Settings) -> int:
    try:
        return run_main(serve_config, settings)
    except CorruptEpochError as exc:
        print(
            f"sie: the config store's epoch file is unreadable: {exc}. Fix or remove it, then restart.", file=sys.stderr
        )
        return 1
    except (ConfigStoreError, TransportUnavailable, UnrestoredStoreError) as exc:
        print(f"sie: the config service cannot start: {exc}", file=sys.stderr)
        return 1
