"""What the two roles that serve the gateway (`gateway`, `all`) wire alike: the auth check before anything starts,
the pool store, the pool directory with the lane signals refreshed over it, and the gateway's metrics.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from contextlib import AsyncExitStack

import attrs

from sie.catalog import Catalog
from sie.gateway.http.auth import AuthSettingsError, check_auth_settings
from sie.gateway.lane_depth import LaneDepths, ReadDepth, known_lanes
from sie.gateway.pools import PoolDirectory
from sie.gateway.scaling import LaneSignals
from sie.gateway.status import ModelStatusSource
from sie.pools import DemandTracker, KeyValue, KeyValuePoolStore, MemoryPoolStore, PoolStore
from sie.roles.serving import RoleMain, RoleSetupError, catalogue_labels, run_main
from sie.settings import Settings
from sie.telemetry.gateway import GatewayMetrics
from sie.telemetry.metrics import Telemetry


def run_gateway_main(main: RoleMain, settings: Settings) -> int:
    """`run_main` for the roles that serve the gateway; exit status 2, before anything starts, when the auth
    settings cannot be served (token mode without an inference token, an unreadable tokens file) or the gRPC port
    is set without grpcio."""
    try:
        check_auth_settings(settings.auth)
    except AuthSettingsError as exc:
        print(f"sie: {exc}", file=sys.stderr)
        return 2
    if settings.gateway.grpc_port is not None and importlib.util.find_spec("grpc") is None:
        print(
            "sie: SIE_GATEWAY_GRPC_PORT is set, but grpcio is not installed: pip install 'sie[grpc]'", file=sys.stderr
        )
        return 2
    return run_main(main, settings)


def pool_store(settings: Settings, bucket: KeyValue | None) -> PoolStore:
    """Where the gateway keeps pools (SIE_POOL_STORE): the broker's KV `bucket` (every replica shares it) or this
    process's memory; `auto` takes the bucket when the role has a broker."""
    choice = settings.pools.store
    if choice == "nats" and bucket is None:
        raise RoleSetupError("SIE_POOL_STORE=nats needs a NATS broker, and this role has none (use memory or auto)")
    if choice == "memory" or bucket is None:
        return MemoryPoolStore()
    return KeyValuePoolStore(bucket)


@attrs.frozen
class GatewayPools:
    """The gateway's pools and the per-lane scale signals built on them."""

    directory: PoolDirectory
    signals: LaneSignals


async def open_gateway_pools(
    stack: AsyncExitStack,
    settings: Settings,
    store: PoolStore,
    status: ModelStatusSource,
    read_depth: ReadDepth,
    catalog: Callable[[], Catalog],
) -> GatewayPools:
    """The pool directory over `store` and the lane signals (pending demand, warm floors, and the queue depths of
    the default lane, the workers' lanes and every lane with demand or a floor), refreshed in the background until
    `stack` closes."""
    pools = settings.pools
    directory = await stack.enter_async_context(
        PoolDirectory(store, pools.static_queue_pools, pools.default_ttl_s, status.workers, catalog=catalog)
    )
    signals = LaneSignals(
        DemandTracker(pools.demand_ttl_s), directory.warm_floors, status.workers, directory.pinned_models_loaded
    )
    lanes = known_lanes(status, settings.lane, lambda: [*signals.pending_demand(), *signals.warm_floors()])
    await stack.enter_async_context(LaneDepths(read_depth, lanes, signals.set_depths))
    return GatewayPools(directory, signals)


def open_gateway_metrics(
    telemetry: Telemetry,
    catalog: Callable[[], Catalog],
    lanes: LaneSignals,
    routing_reason: Callable[[], str | None] | None = None,
) -> GatewayMetrics | None:
    """The gateway's series on `telemetry` (None while metrics are off), model labels bounded by `catalog`, lane
    values read from `lanes`, whether requests can be routed from `routing_reason`."""
    if not telemetry.enabled:
        return None
    return GatewayMetrics(telemetry, catalogue_labels(catalog), lanes, routing_reason)
