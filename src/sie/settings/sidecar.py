"""The sidecar's probes, pool admission and pull loop (seed 001), and the batch former it feeds
(contracts B §5.1, §5.3; DESIGN §7). In `--role all` the same batching values apply in-process.
"""

from __future__ import annotations

import attrs

from sie.settings._parsers import boolean, http_url, integer, milliseconds, seconds
from sie.settings._spec import Env, setting


@attrs.frozen
class SidecarSettings:
    """Probes, heartbeats, pool admission and the JetStream pull loop of one lane's sidecar."""

    probe_port: int = setting(
        Env(
            "SIE_WORKER_PROBE_PORT",
            integer(0, 65535),
            "Port of the sidecar's `/healthz` and `/readyz` probes.",
            flag="--probe-port",
        ),
        9095,
    )
    heartbeat_interval_s: float = setting(
        Env(
            "SIE_HEALTH_INTERVAL_S",
            seconds(positive=True),
            "Period of `sie.health.{worker_id}` heartbeats and of the IPC Ping behind readiness.",
        ),
        1.0,
    )
    gateway_url: str | None = setting(
        Env(
            "SIE_GATEWAY_URL",
            http_url(),
            "Gateway base URL for pool admission (`GET /v1/pools`). Unset: no pool admission.",
        ),
        None,
    )
    pool_admission: bool = setting(
        Env("SIE_POOL_ADMISSION", boolean(), "Check pool assignment before pulling (needs SIE_GATEWAY_URL)."),
        True,
    )
    pool_poll_interval_s: float = setting(
        Env("SIE_POOL_POLL_INTERVAL_S", seconds(positive=True), "Period of the pool-status poll."),
        10.0,
    )
    load_hold_s: float = setting(
        Env(
            "SIE_SIDECAR_LOAD_HOLD_S",
            seconds(positive=True),
            "How long work waits (progress-acked) for a model to load before it is answered MODEL_LOADING.",
        ),
        20.0,
    )
    fetch_budget: int = setting(
        Env("SIE_NATS_FETCH_BUDGET", integer(minimum=1), "Most messages one JetStream fetch asks for."),
        64,
    )


@attrs.frozen
class BatchingSettings:
    """Admission, tokenization threads and the cost-bounded batch former."""

    max_batch_items: int = setting(
        Env("SIE_MAX_BATCH_REQUESTS", integer(minimum=1), "Most items in one batch."),
        64,
    )
    max_batch_tokens: int | None = setting(
        Env(
            "SIE_MAX_BATCH_TOKENS",
            integer(minimum=1),
            "Cap on a batch's token cost on top of each profile's `max_batch_tokens` (the smaller wins).",
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
        ),
        0.010,
    )
    max_pending_items: int = setting(
        Env(
            "SIE_MAX_CONCURRENT_REQUESTS",
            integer(minimum=1),
            "Pending items per model before new work is refused with QUEUE_FULL.",
        ),
        512,
    )
    tokenizer_threads: int = setting(
        Env("SIE_PREPROCESSOR_WORKERS", integer(minimum=1), "Threads that tokenize off the event loop."),
        4,
    )
