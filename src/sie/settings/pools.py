"""Pools and scale-from-zero at the gateway (seed 000 §2, §16.3): where pool leases are stored, how long a lease
lasts by default, the deploy-owned queue pools, per-lane in-flight backpressure and how long pending demand lasts.
"""

from __future__ import annotations

import attrs

from sie.settings._parsers import boolean, choice, integer, name_token, seconds, string_list
from sie.settings._spec import Env, setting

_GATEWAY_ROLES = ("gateway", "all")


@attrs.frozen
class PoolSettings:
    """The pool store, the static queue pools, lane in-flight backpressure and pending demand."""

    store: str = setting(
        Env(
            "SIE_POOL_STORE",
            choice("auto", "memory", "nats"),
            "Where pools and their leases live: `nats` (a JetStream KV bucket, `SIE_POOLS`, shared by every gateway "
            "replica), `memory` (this process only) or `auto` (nats for `--role gateway`, memory for `--role all`).",
            roles=_GATEWAY_ROLES,
            read_by=("sie.roles.gateway_parts",),
        ),
        "auto",
    )
    default_ttl_s: float = setting(
        Env(
            "SIE_POOL_DEFAULT_TTL_S",
            seconds(positive=True, maximum=30 * 86400),
            "Lease of a pool created without `ttl_seconds`: it expires unless renewed (`POST /v1/pools/{name}/renew`; "
            "the SDK renews every 60 s).",
            roles=_GATEWAY_ROLES,
            read_by=("sie.roles.gateway_parts", "sie.gateway.http.app"),
        ),
        300.0,
    )
    static_queue_pools: tuple[str, ...] = setting(
        Env(
            "SIE_GATEWAY_STATIC_QUEUE_POOLS",
            string_list(name_token()),
            "Deploy-owned queue pools (worker groups with their own SIE_POOL): requests may name them, API pools may "
            "use them as `queue_pool`, and they cannot be deleted. `default` always exists.",
            roles=_GATEWAY_ROLES,
            read_by=("sie.roles.gateway_parts", "sie.gateway.http.app"),
        ),
        (),
    )
    max_lane_in_flight_items: int = setting(
        Env(
            "SIE_GATEWAY_MAX_LANE_IN_FLIGHT_ITEMS",
            integer(minimum=1),
            "Per-lane backpressure: work items this gateway has published on one lane (pool, machine profile, bundle) "
            "and not yet seen answered, above which a request is over the lane's limit (recorded always; refused "
            "with 503 QUEUE_FULL only with SIE_GATEWAY_LANE_BACKPRESSURE_ENFORCE).",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.app",),
        ),
        10_000,
    )
    lane_backpressure_enforce: bool = setting(
        Env(
            "SIE_GATEWAY_LANE_BACKPRESSURE_ENFORCE",
            boolean(),
            "Refuse (503 QUEUE_FULL, Retry-After 5) requests over SIE_GATEWAY_MAX_LANE_IN_FLIGHT_ITEMS; false only "
            "counts them (`sie_gateway_lane_admission_decisions_total`).",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.app",),
        ),
        False,
    )
    demand_ttl_s: float = setting(
        Env(
            "SIE_GATEWAY_DEMAND_TTL_S",
            seconds(positive=True),
            "How long a request that found no worker (or was shed) counts as pending demand of its lane, unless work "
            "is published to the lane first: the scale-from-zero signal (`/v1/scaling/lanes`, "
            "`sie_gateway_lane_pending_demand`).",
            roles=_GATEWAY_ROLES,
            read_by=("sie.roles.gateway_parts", "sie.gateway.http.app"),
        ),
        300.0,
    )
