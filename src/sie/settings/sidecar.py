"""The sidecar's probes, heartbeats, pull loop, pool admission gate and local ingest (seed 001), and the batch
former it feeds (contracts B §5.1, §5.3; DESIGN §7). In `--role all` the same pull and batching values apply
in-process (the pool gate is the distributed sidecar's only). Gateways read the heartbeat period too: it sizes the
first round of heartbeats they wait for before they say ready.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from sie.settings._parsers import byte_size, http_url, integer, milliseconds, path, seconds, text
from sie.settings._spec import Env, setting

_PIPELINE_ROLES = ("sidecar", "all")


@attrs.frozen
class SidecarSettings:
    """Probes, heartbeats, model-load holds, the JetStream pull loop, the pool gate and the local-ingest socket of
    one lane's sidecar."""

    probe_host: str = setting(
        Env(
            "SIE_WORKER_PROBE_HOST",
            text(),
            "Interface of the sidecar's `/healthz` and `/readyz` probes.",
            flag="--host",
            roles=("sidecar",),
            read_by=("sie.roles.sidecar",),
        ),
        "0.0.0.0",
    )
    probe_port: int = setting(
        Env(
            "SIE_WORKER_PROBE_PORT",
            integer(0, 65535),
            "Port of the sidecar's `/healthz` and `/readyz` probes (0 picks a free port).",
            flag="--port",
            roles=("sidecar",),
            read_by=("sie.roles.sidecar",),
        ),
        9095,
    )
    heartbeat_interval_s: float = setting(
        Env(
            "SIE_HEALTH_INTERVAL_S",
            seconds(positive=True),
            "Period of `sie.health.{worker_id}` heartbeats and of the IPC Ping behind readiness. A gateway says "
            "ready once it has listened for a first round of heartbeats, a few periods long: give gateways the "
            "sidecars' value.",
            roles=("sidecar", "gateway"),
            read_by=("sie.sidecar.pod.health", "sie.roles.gateway"),
        ),
        1.0,
    )
    load_hold_s: float = setting(
        Env(
            "SIE_SIDECAR_LOAD_HOLD_S",
            seconds(positive=True),
            "How long work without a deadline waits (progress-acked) for its model to load before it is answered "
            "MODEL_LOADING. Work with a deadline (every item of this gateway) waits until one second before it.",
            roles=_PIPELINE_ROLES,
            read_by=("sie.sidecar.readiness",),
        ),
        20.0,
    )
    fetch_budget: int = setting(
        Env(
            "SIE_NATS_FETCH_BUDGET",
            integer(minimum=1),
            "Most messages one fetch from the lane asks for.",
            roles=_PIPELINE_ROLES,
            read_by=("sie.sidecar.sidecar",),
        ),
        64,
    )
    gateway_url: str | None = setting(
        Env(
            "SIE_GATEWAY_URL",
            http_url(),
            "Base URL of a gateway (its Service) whose `GET /v1/pools` the sidecar polls for pool admission: "
            "work whose `admission_pool` names a logical pool that does not assign this worker is NAKed "
            "for another worker. Unset: no gate, every item is admitted. Also `sie pools`' default `--gateway`.",
            roles=("sidecar",),
            read_by=("sie.sidecar.pool_admission", "sie.cli.pools"),
        ),
        None,
    )
    pool_poll_interval_s: float = setting(
        Env(
            "SIE_POOL_POLL_INTERVAL_S",
            seconds(positive=True),
            "Period of the pool admission gate's `GET /v1/pools` (with SIE_GATEWAY_URL); assignments a gateway "
            "changes reach the sidecar within it.",
            roles=("sidecar",),
            read_by=("sie.sidecar.pool_admission",),
        ),
        10.0,
    )
    gateway_token: str | None = setting(
        Env(
            "SIE_GATEWAY_TOKEN",
            text(),
            "Bearer token the sidecar sends with `GET /v1/pools` (an inference token when the gateway runs "
            "SIE_AUTH_MODE=token). Unset: none.",
            flag=None,
            secret=True,
            roles=("sidecar",),
            read_by=("sie.sidecar.pool_admission",),
        ),
        None,
    )

    local_ingest_socket: Path | None = setting(
        Env(
            "SIE_LOCAL_INGEST_SOCKET",
            path(),
            "Unix socket (mode 0600, this user only) on which a co-located producer sends encode, score and extract "
            "work items straight into the sidecar's pipeline, without HTTP or the broker (docs: Local ingest). "
            "The sidecar refuses to start when something that is no socket, or a socket another process listens "
            "on, is at the path; a stale socket is replaced. Unset: off.",
            roles=_PIPELINE_ROLES,
            read_by=("sie.sidecar.local_ingest",),
        ),
        None,
    )
    local_ingest_max_frame_bytes: int = setting(
        Env(
            "SIE_LOCAL_INGEST_MAX_FRAME_BYTES",
            byte_size(),
            "Largest local-ingest frame either way: a longer request closes its connection unread, a longer "
            "result is answered PAYLOAD_TOO_LARGE. A connection retains at most four frames of requests.",
            roles=_PIPELINE_ROLES,
            read_by=("sie.sidecar.local_ingest",),
        ),
        16 * 1024 * 1024,
    )
    local_ingest_max_inflight_items: int = setting(
        Env(
            "SIE_LOCAL_INGEST_MAX_INFLIGHT_ITEMS",
            integer(minimum=1),
            "Work items one local-ingest connection may have unanswered; a submit past it is refused QUEUE_FULL.",
            roles=_PIPELINE_ROLES,
            read_by=("sie.sidecar.local_ingest",),
        ),
        1024,
    )
    local_ingest_max_connections: int = setting(
        Env(
            "SIE_LOCAL_INGEST_MAX_CONNECTIONS",
            integer(minimum=1),
            "Local-ingest connections open at once; one more is answered QUEUE_FULL and closed.",
            roles=_PIPELINE_ROLES,
            read_by=("sie.sidecar.local_ingest",),
        ),
        16,
    )


@attrs.frozen
class BatchingSettings:
    """Admission, tokenization threads and the cost-bounded batch former."""

    max_batch_items: int = setting(
        Env(
            "SIE_MAX_BATCH_REQUESTS",
            integer(minimum=1),
            "Most items in one batch.",
            roles=("sidecar", "worker", "all"),
            read_by=("sie.sidecar.scheduler", "sie.worker.service"),
        ),
        64,
    )
    max_batch_tokens: int | None = setting(
        Env(
            "SIE_MAX_BATCH_TOKENS",
            integer(minimum=1),
            "Cap on a batch's token cost on top of each profile's `max_batch_tokens` (the smaller wins).",
            roles=_PIPELINE_ROLES,
            read_by=("sie.sidecar.scheduler",),
        ),
        None,
    )
    max_batch_wait_s: float = setting(
        Env(
            "SIE_MAX_BATCH_WAIT_MS",
            milliseconds(),
            "Longest a filling batch waits for more callers; while the worker runs a batch of the model, the "
            "next one fills until just before that batch should end. An idle worker gets a lone item at once; "
            "0 never waits.",
            roles=_PIPELINE_ROLES,
            read_by=("sie.sidecar.sidecar",),
        ),
        0.010,
    )
    max_pending_items: int = setting(
        Env(
            "SIE_MAX_CONCURRENT_REQUESTS",
            integer(minimum=1),
            "Work items per model a sidecar holds at once (fetched, not yet answered); more are given back to "
            "the stream (NAK, redelivered after 0.1 s) for this or another sidecar to take.",
            roles=_PIPELINE_ROLES,
            read_by=("sie.sidecar.sidecar",),
        ),
        512,
    )
    tokenizer_threads: int = setting(
        Env(
            "SIE_PREPROCESSOR_WORKERS",
            integer(minimum=1),
            "Threads that tokenize off the event loop.",
            roles=_PIPELINE_ROLES,
            read_by=("sie.sidecar.sidecar",),
        ),
        4,
    )
