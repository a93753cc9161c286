"""The NATS connection and the JetStream work streams and lane consumers (seed 000 §8.2, contracts B §4.3).

Gateways and sidecars both create and reconcile `WORK_POOL_{pool}`, so both read the stream values; the
lane consumer's values are the sidecar's. `--role all` keeps the same semantics in its in-process streams.
"""

from __future__ import annotations

import attrs

from sie.settings._parsers import choice, integer, seconds, text
from sie.settings._spec import Env, setting

_BROKER_ROLES = ("gateway", "config", "sidecar")
_NATS_READERS = ("sie.transport.nats.connection",)
_STREAM_READERS = ("sie.transport.nats.streams", "sie.transport.loopback.stream")


@attrs.frozen
class NatsSettings:
    """How to reach NATS; `--role all` needs no broker (its transport is in-process)."""

    url: str | None = setting(
        Env(
            "SIE_NATS_URL",
            text(),
            "NATS server URL(s), comma-separated. Unset: the gateway answers 503 and the config "
            "service publishes no deltas.",
            roles=_BROKER_ROLES,
            read_by=(*_NATS_READERS, "sie.roles.config"),
        ),
        None,
    )
    user: str | None = setting(
        Env("SIE_NATS_USER", text(), "NATS user name.", roles=_BROKER_ROLES, read_by=_NATS_READERS), None
    )
    password: str | None = setting(
        Env(
            "SIE_NATS_PASSWORD",
            text(),
            "NATS password.",
            flag=None,
            secret=True,
            roles=_BROKER_ROLES,
            read_by=_NATS_READERS,
        ),
        None,
    )


@attrs.frozen
class StreamSettings:
    """The `WORK_POOL_{pool}` streams and how lane consumers settle deliveries."""

    storage: str = setting(
        Env(
            "SIE_STREAM_STORAGE",
            choice("memory", "file"),
            "Storage of the work streams and the gateways' `SIE_POOLS` bucket; an existing stream or bucket keeps "
            "its own (a stream's is warned about).",
            roles=("gateway", "sidecar"),
            read_by=("sie.transport.nats.streams", "sie.transport.nats.kv"),
        ),
        "memory",
    )
    replicas: int = setting(
        Env(
            "SIE_STREAM_REPLICAS",
            integer(minimum=1),
            "Replica count of the streams and the `SIE_POOLS` bucket on a clustered NATS.",
            roles=("gateway", "sidecar"),
            read_by=("sie.transport.nats.streams", "sie.transport.nats.kv"),
        ),
        1,
    )
    max_age_s: float = setting(
        Env(
            "SIE_STREAM_MAX_AGE_S",
            seconds(positive=True),
            "Work stream `max_age`; keep it above max_deliver x ack_wait so work is never aged out while it "
            "may still be redelivered.",
            roles=("gateway", "sidecar", "all"),
            read_by=_STREAM_READERS,
        ),
        1800.0,
    )
    max_msgs: int = setting(
        Env(
            "SIE_STREAM_MAX_MSGS",
            integer(minimum=1),
            "Work stream `max_msgs`; publishes beyond it are rejected (discard new), answered with 503.",
            roles=("gateway", "sidecar", "all"),
            read_by=_STREAM_READERS,
        ),
        100_000,
    )
    max_deliver: int = setting(
        Env(
            "SIE_MAX_DELIVER",
            integer(minimum=1),
            "Deliveries of one work item before it becomes a dead letter (kept 24 h; `sie dlq`).",
            roles=("sidecar", "all"),
            read_by=_STREAM_READERS,
        ),
        20,
    )
    ack_wait_s: float = setting(
        Env(
            "SIE_ACK_WAIT_S",
            seconds(positive=True),
            "Lane consumer `ack_wait`: an unsettled delivery is redelivered after this long. A sidecar "
            "progress-ACKs what it holds longer than half of it, so it bounds how long the work of a sidecar "
            "that died waits before another (or its restart) gets it.",
            roles=("sidecar", "all"),
            read_by=(*_STREAM_READERS, "sie.sidecar.readiness", "sie.sidecar.sidecar"),
        ),
        5.0,
    )
    nak_delay_s: float = setting(
        Env(
            "SIE_NAK_DELAY_S",
            seconds(),
            "Redelivery delay of a retryable NAK (progress ACKs while loading stay below ack_wait).",
            roles=("sidecar", "all"),
            read_by=("sie.sidecar.sidecar",),
        ),
        5.0,
    )
