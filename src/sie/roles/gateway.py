"""`sie run --role gateway`: the HTTP inference API publishing to NATS JetStream lanes and collecting
results on `_INBOX.{router_id}.>`; workers known from `sie.health.>` heartbeats; model config from the
filesystem seed, then kept in step with the config service (bootstrap, epoch poll, live deltas). NATS is
connected in the background: while it is unreachable the gateway serves `/healthz`, `/readyz` says why it is not
ready and inference answers 503 QUEUE_UNAVAILABLE. Once connected, `/readyz` waits one first round of worker
heartbeats (a few SIE_HEALTH_INTERVAL_S), so a ready gateway knows every live worker's lane and answers PROVISIONING
only for lanes nobody serves. Pools live in the broker's `SIE_POOLS` KV bucket (SIE_POOL_STORE), shared by every
gateway replica. Crash leftovers are swept: spent work nobody captured goes to the dead letters, and the direct-dispatch
streams of workers that are gone are deleted once empty and idle past SIE_STREAM_MAX_AGE_S. It listens on every
interface unless SIE_GATEWAY_HOST says otherwise.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from sie.gateway.config_sync import ConfigState, ConfigSync
from sie.gateway.dead_letters import SWEEP_INTERVAL_S, DeadLetterQueue
from sie.gateway.http.app import GatewaySources, build_gateway_app, serving_state
from sie.gateway.http.auth import GatewayAuth
from sie.gateway.offload import PayloadOffload
from sie.gateway.registry import WorkerRegistry, first_heartbeat_round_s
from sie.gateway.worker_streams import WorkerStreamSweep
from sie.http.serving import serve_until_signalled
from sie.roles.gateway_parts import open_gateway_metrics, open_gateway_pools, pool_store, run_gateway_main
from sie.roles.serving import baseline_catalog, http_listener, metrics_routes, open_telemetry, open_tracing
from sie.runtime import freeze_startup_heap
from sie.settings import Settings
from sie.settings.gateway import CONTAINER_HOST
from sie.stores.payload_store import open_payload_store
from sie.telemetry.gateway import StoreMetrics, WorkerStreamMetrics
from sie.transport.nats import POOL_BUCKET, NatsTransport
from sie.transport.reconnecting import ReconnectingTransport


async def serve_gateway(settings: Settings) -> None:
    router_id = settings.process.router_id
    async with AsyncExitStack() as stack:
        telemetry = open_telemetry(stack, settings, "sie-gateway")
        state = ConfigState(baseline_catalog(settings), telemetry=telemetry)
        tracing = open_tracing(stack, settings, "sie-gateway")
        nats, streams, name = settings.nats, settings.stream, f"sie-gateway-{router_id}"
        transport = await stack.enter_async_context(
            ReconnectingTransport(lambda: NatsTransport(nats, streams, name=name), description=f"NATS at {nats.url}")
        )
        unavailable = transport.unavailable_reason
        telemetry.observe_connection(lambda: unavailable() is None)
        first_round = first_heartbeat_round_s(settings.sidecar.heartbeat_interval_s)
        registry = await stack.enter_async_context(
            WorkerRegistry(
                transport, settings.gateway.worker_stale_s, unavailable=unavailable, first_heartbeat_wait_s=first_round
            )
        )
        await stack.enter_async_context(ConfigSync(state, transport, settings.config_sync, settings.auth.admin_token))
        stores = StoreMetrics(telemetry) if telemetry.enabled else None
        dead_letters = await stack.enter_async_context(
            DeadLetterQueue(
                transport, settings.gateway.request_timeout_s, metrics=stores, sweep_interval_s=SWEEP_INTERVAL_S
            )
        )
        sweep_metrics = WorkerStreamMetrics(telemetry) if telemetry.enabled else None
        await stack.enter_async_context(
            WorkerStreamSweep(transport, registry.live_worker_ids, settings.stream.max_age_s, metrics=sweep_metrics)
        )
        payloads = settings.payloads  # the broker's max_payload is known once connected
        offload = PayloadOffload(
            open_payload_store(payloads.store_url), lambda: transport.max_payload, payloads.inline_limit_bytes, stores
        )
        stack.push_async_callback(offload.aclose)  # pending deletes finish before the transport closes
        if payloads.store_url and payloads.sweep_age_s > 0:
            await stack.enter_async_context(offload.sweeping(payloads.sweep_age_s))
        auth = await stack.enter_async_context(GatewayAuth.from_settings(settings.auth))
        store = pool_store(settings, transport.key_value(POOL_BUCKET))  # every gateway replica shares the bucket
        pools = await open_gateway_pools(stack, settings, store, registry, transport.lane_depth, state)
        metrics = open_gateway_metrics(telemetry, state, pools.signals, registry.routing_reason)
        sources = GatewaySources(
            state, transport, registry, registry, registry.healthy_workers, registry.routing_reason, offload=offload,
            dead_letters=dead_letters, auth=auth, tracing=tracing, metrics=metrics, pools=pools.directory,
            signals=pools.signals,
        )  # fmt: skip
        host = settings.gateway.host or CONTAINER_HOST
        app = build_gateway_app(
            sources, settings.gateway, settings.lane, router_id, metrics_routes(telemetry), settings.pools, host
        )
        grace = settings.process.shutdown_grace_s

        async def drain() -> None:
            await serving_state(app).drain(grace)

        listener = http_listener(host, settings.gateway.port, settings)
        freeze_startup_heap()
        await serve_until_signalled(app, listener, drain)


def run(settings: Settings) -> int:
    return run_gateway_main(serve_gateway, settings)
