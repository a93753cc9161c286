"""The gateway's HTTP surface and queue admission (seed 000 §2, §16.3) and the token auth shared by the
gateway and the config service (seed 000 §3, §13; contracts A §2.4, B §1.10).
"""

from __future__ import annotations

import attrs

from sie.settings._parsers import boolean, byte_size, choice, integer, name_token, seconds, string_list, text
from sie.settings._spec import Env, setting


@attrs.frozen
class GatewaySettings:
    """The inference HTTP server, backpressure limits, and where pools are stored."""

    host: str = setting(
        Env("SIE_GATEWAY_HOST", text(), "Interface the gateway's HTTP server binds.", flag="--host"),
        "0.0.0.0",
    )
    port: int = setting(
        Env(
            "SIE_GATEWAY_PORT",
            integer(0, 65535),
            "Port of the gateway's HTTP server (0 picks a free port).",
            flag="--port",
        ),
        8080,
    )
    request_timeout_s: float = setting(
        Env(
            "SIE_GATEWAY_REQUEST_TIMEOUT",
            seconds(positive=True),
            "How long a request waits for all its results before 504 GATEWAY_TIMEOUT.",
        ),
        30.0,
    )
    max_stream_pending: int = setting(
        Env(
            "SIE_GATEWAY_MAX_STREAM_PENDING",
            integer(minimum=1),
            "Pool-wide backpressure: pending messages in `WORK_POOL_{pool}` above which publishes get 503.",
        ),
        50_000,
    )
    max_lane_in_flight_items: int = setting(
        Env(
            "SIE_GATEWAY_MAX_LANE_IN_FLIGHT_ITEMS",
            integer(minimum=1),
            "Per-lane backpressure: in-flight work items per pool/profile/bundle lane on this gateway.",
        ),
        10_000,
    )
    lane_backpressure_enforce: bool = setting(
        Env(
            "SIE_GATEWAY_LANE_BACKPRESSURE_ENFORCE",
            boolean(),
            "Shed on the per-lane limit too; off: the decision is only recorded.",
        ),
        False,
    )
    max_body_bytes: int = setting(
        Env("SIE_GATEWAY_MAX_BODY_BYTES", byte_size(), "Largest request body accepted; larger gets 413."),
        256 * 2**20,
    )
    configured_gpus: tuple[str, ...] = setting(
        Env(
            "SIE_GATEWAY_CONFIGURED_GPUS",
            string_list(name_token()),
            "Machine profiles this cluster has; others get 503 gpu_not_configured. Empty: any.",
        ),
        (),
    )
    static_queue_pools: tuple[str, ...] = setting(
        Env(
            "SIE_GATEWAY_STATIC_QUEUE_POOLS",
            string_list(name_token()),
            "Deploy-owned queue pools that API pools may name as a non-default `queue_pool`.",
        ),
        (),
    )
    pool_store: str = setting(
        Env(
            "SIE_POOL_STORE",
            choice("nats", "memory", "kubernetes"),
            "Where pool specs and leases live; `--role all` always uses memory.",
        ),
        "nats",
    )
    worker_stale_s: float = setting(
        Env(
            "SIE_GATEWAY_WORKER_STALE_S",
            seconds(positive=True),
            "A worker with no heartbeat for this long counts as unhealthy (forgotten after 6x this).",
        ),
        10.0,
    )


@attrs.frozen
class AuthSettings:
    """Bearer tokens: inference/read tokens, the admin (write) token, and config read tokens."""

    mode: str = setting(
        Env(
            "SIE_AUTH_MODE",
            choice("none", "token", aliases={"static": "token"}),
            "Gateway auth: `token` (alias `static`) requires a bearer token; `none` disables auth.",
        ),
        "none",
    )
    tokens: tuple[str, ...] = setting(
        Env(
            "SIE_AUTH_TOKENS",
            string_list(),
            "Tokens accepted for inference and read routes; never grant writes.",
            flag=None,
            aliases=("SIE_AUTH_TOKEN",),
            secret=True,
        ),
        (),
    )
    admin_token: str | None = setting(
        Env(
            "SIE_ADMIN_TOKEN",
            text(),
            "Token for config, pool and admin writes; gateways and sidecars send it to the config service.",
            flag=None,
            secret=True,
        ),
        None,
    )
    config_read_tokens: tuple[str, ...] = setting(
        Env(
            "SIE_CONFIG_READ_TOKEN",
            string_list(),
            "Tokens that may read the config service (including export) but not write.",
            flag=None,
            secret=True,
        ),
        (),
    )
    exempt_operational: bool = setting(
        Env(
            "SIE_AUTH_EXEMPT_OPERATIONAL",
            boolean(),
            "Exempt `/`, `/health`, `/metrics` and `/ws/*` from auth (`/healthz`, `/readyz` always are).",
        ),
        False,
    )
