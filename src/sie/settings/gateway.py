"""The gateway's HTTP surface and queue admission (seed 000 §2, §16.3) and the bearer tokens of the gateway and
the config service (seed 000 §3, §13; contracts A §2.4, B §1.10).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import attrs

from sie.settings._parsers import (
    boolean,
    byte_size,
    choice,
    integer,
    key_values,
    name_token,
    path,
    seconds,
    string_list,
    text,
)
from sie.settings._spec import Env, setting

_GATEWAY_ROLES = ("gateway", "all")
# Where the gateway listens unless SIE_GATEWAY_HOST says (its role file picks): `--role all` is a laptop's server,
# for this machine only; `--role gateway` runs in a container, reached through the pod's interfaces.
LOOPBACK_HOST: Final = "127.0.0.1"
CONTAINER_HOST: Final = "0.0.0.0"
# The TEI routes a request at the server's root may reach without a model in its path (SIE_COMPAT_DEFAULT_MODELS).
COMPAT_DEFAULT_ROUTES: Final = ("embed", "embed_sparse", "embed_all", "rerank", "predict", "tokenize", "decode")


@attrs.frozen
class GatewaySettings:
    """The inference HTTP server, its limits and backpressure, and how workers are judged alive."""

    host: str | None = setting(
        Env(
            "SIE_GATEWAY_HOST",
            text(),
            "Interface the gateway's HTTP server binds. Unset: this machine only for `--role all`, every "
            "interface for `--role gateway` (a container's).",
            flag="--host",
            shown_default=f"`{LOOPBACK_HOST}` (all), `{CONTAINER_HOST}` (gateway)",
            roles=_GATEWAY_ROLES,
            read_by=("sie.roles.gateway", "sie.roles.all"),
        ),
        None,
    )
    port: int = setting(
        Env(
            "SIE_GATEWAY_PORT",
            integer(0, 65535),
            "Port of the gateway's HTTP server (0 picks a free port).",
            flag="--port",
            roles=_GATEWAY_ROLES,
            read_by=("sie.roles.gateway", "sie.roles.all"),
        ),
        8080,
    )
    grpc_port: int | None = setting(
        Env(
            "SIE_GATEWAY_GRPC_PORT",
            integer(0, 65535),
            "Port of the KServe V2 / Open Inference Protocol gRPC service (`inference.GRPCInferenceService`, "
            "for Triton's gRPC clients), on the HTTP server's interface; needs the `grpc` extra "
            "(`pip install 'sie[grpc]'`). Unset: no gRPC service (the protocol's HTTP routes are always served).",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.app", "sie.roles.gateway_parts"),
        ),
        None,
    )
    request_timeout_s: float = setting(
        Env(
            "SIE_GATEWAY_REQUEST_TIMEOUT",
            seconds(positive=True),
            "How long a request waits for all its results before 504 GATEWAY_TIMEOUT.",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.app",),
        ),
        30.0,
    )
    max_stream_pending: int = setting(
        Env(
            "SIE_GATEWAY_MAX_STREAM_PENDING",
            integer(minimum=1),
            "Pool-wide backpressure: pending messages in `WORK_POOL_{pool}` above which requests get 503 QUEUE_FULL.",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.app",),
        ),
        50_000,
    )
    max_body_bytes: int = setting(
        Env(
            "SIE_GATEWAY_MAX_BODY_BYTES",
            byte_size(),
            "Largest request body accepted; larger gets 413.",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.app",),
        ),
        256 * 2**20,
    )
    max_items: int = setting(
        Env(
            "SIE_GATEWAY_MAX_ITEMS",
            integer(minimum=1),
            "Most items one request may carry (the work queue takes at most 4096 per request); more "
            "gets 413 PAYLOAD_TOO_LARGE before anything is queued.",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.app",),
        ),
        4096,
    )
    max_item_chars: int = setting(
        Env(
            "SIE_GATEWAY_MAX_ITEM_CHARS",
            integer(minimum=1),
            "Longest text of one item (or of one generation prompt, its chat messages together), in characters, "
            "checked before tokenization; longer gets 400 INPUT_TOO_LONG "
            "(models read at most their max sequence length of it).",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.app",),
        ),
        100_000,
    )
    max_labels: int = setting(
        Env(
            "SIE_GATEWAY_MAX_LABELS",
            integer(minimum=1),
            "Most labels one extract request may name (a zero-shot model reads every label with every text, so "
            "they bound its cost); more, or a label that is blank or over 128 characters, gets 400 before anything "
            "is queued. The default is the public server's limit.",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.app",),
        ),
        1000,
    )
    max_images_per_item: int = setting(
        Env(
            "SIE_GATEWAY_MAX_IMAGES_PER_ITEM",
            integer(minimum=1),
            "Most images one item may carry (an image model encodes each, then averages them); more gets 400 naming "
            "the item before anything is queued.",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.app",),
        ),
        16,
    )
    max_image_bytes: int = setting(
        Env(
            "SIE_GATEWAY_MAX_IMAGE_BYTES",
            integer(minimum=1, maximum=256 * 1024 * 1024),
            "Most compressed bytes of one image; a larger one gets 400 naming the item, before it is decoded (at "
            "most 256 MiB, what the sidecar and worker decode at most).",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.app",),
        ),
        20 * 1024 * 1024,
    )
    max_image_pixels: int = setting(
        Env(
            "SIE_GATEWAY_MAX_IMAGE_PIXELS",
            integer(minimum=1, maximum=89_478_485),
            "Most pixels (width × height, read from the image's header) of one image: a decompression bomb (a small "
            "file of huge dimensions) gets 400 naming the item before any pixel is decoded (at most 89,478,485, "
            "Pillow's own decompression-bomb limit).",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.app",),
        ),
        40_000_000,
    )
    compat_default_models: tuple[tuple[str, str], ...] = setting(
        Env(
            "SIE_COMPAT_DEFAULT_MODELS",
            key_values(COMPAT_DEFAULT_ROUTES),
            "The model each TEI route at the server's root serves, for TEI clients that join the route to the "
            "host and drop a base URL's path (Haystack's TEI ranker posts to `/rerank`), e.g. "
            "`rerank=cross-encoder/ms-marco-MiniLM-L6-v2,embed=BAAI/bge-small-en-v1.5`. Keys: `embed`, "
            "`embed_sparse`, `embed_all`, `predict`, `tokenize`, `decode`, `rerank` (a `/rerank` body with TEI's "
            "`texts`; one with `documents` is Cohere's or Jina's and names its model). A root route without one "
            "answers TEI's 422 (`INVALID_INPUT`) naming the `/{model}/…` form, which needs no setting.",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.app",),
        ),
        (),
    )
    configured_gpus: tuple[str, ...] = setting(
        Env(
            "SIE_GATEWAY_CONFIGURED_GPUS",
            string_list(name_token()),
            "Machine profiles this cluster has: a request whose `X-SIE-MACHINE-PROFILE` names another gets 503 "
            "`gpu_not_configured`; `/health` lists them. Empty: any.",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.app",),
        ),
        (),
    )
    worker_stale_s: float = setting(
        Env(
            "SIE_GATEWAY_WORKER_STALE_S",
            seconds(positive=True),
            "A worker with no heartbeat for this long counts as unhealthy (forgotten after 6x this).",
            roles=("gateway",),
            read_by=("sie.roles.gateway",),
        ),
        10.0,
    )


@attrs.frozen
class AuthSettings:
    """Bearer tokens: gateway auth (mode, inference tokens, exempt routes), the admin token, config read tokens."""

    mode: str = setting(
        Env(
            "SIE_AUTH_MODE",
            choice("none", "token", aliases={"static": "token"}),
            "Gateway auth: `token` (alias `static`) requires a bearer token on every route but `/healthz` and "
            "`/readyz`; `none` requires none (admin routes still need SIE_ADMIN_TOKEN when it is set).",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.auth",),
        ),
        "none",
    )
    tokens: tuple[str, ...] = setting(
        Env(
            "SIE_AUTH_TOKENS",
            string_list(),
            "Inference tokens: with SIE_AUTH_MODE=token the gateway accepts any of them (or the admin token) on "
            "its inference, read and operational routes. The config service accepts them for reads (never "
            "writes).",
            flag=None,
            aliases=("SIE_AUTH_TOKEN",),
            secret=True,
            roles=("gateway", "config", "all"),
            read_by=("sie.gateway.http.auth", "sie.roles.config"),
        ),
        (),
    )
    tokens_file: Path | None = setting(
        Env(
            "SIE_AUTH_TOKENS_FILE",
            path(),
            "A file of more inference tokens, one a line (blank lines and `#` comments skipped), re-read within "
            "a second or two of a change: tokens rotate without a restart (a mounted Kubernetes secret works).",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.auth",),
        ),
        None,
    )
    exempt_operational: bool = setting(
        Env(
            "SIE_AUTH_EXEMPT_OPERATIONAL",
            boolean(),
            "With SIE_AUTH_MODE=token, serve `/`, `/health`, `/metrics`, `/docs`, `/ws/*` and `/v1/scaling/*` "
            "without a token. They show workers, models and queue depth: leave it false unless only operators reach "
            "the port.",
            roles=_GATEWAY_ROLES,
            read_by=("sie.gateway.http.auth",),
        ),
        False,
    )
    admin_token: str | None = setting(
        Env(
            "SIE_ADMIN_TOKEN",
            text(),
            "Token for config writes; gateways and sidecars send it when they read the config service, and "
            "`sie config` sends it. Set for the gateway, its admin routes (`/v1/dlq`, mutations under "
            "`/v1/configs`, `/v1/pools`, `/v1/admin`, `/v1/placement`; `sie dlq`) require it; in token mode, "
            "unset, they are closed.",
            flag=None,
            secret=True,
            roles=("gateway", "config", "sidecar", "all"),
            read_by=("sie.roles.config", "sie.roles.gateway", "sie.sidecar.live_config", "sie.gateway.http.auth"),
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
            roles=("config",),
            read_by=("sie.roles.config",),
        ),
        (),
    )
