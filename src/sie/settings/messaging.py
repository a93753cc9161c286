"""The NATS connection and the JetStream work streams and lane consumers (seed 000 §8.2, contracts B §4.3).

Gateways and sidecars both create and reconcile `WORK_POOL_{pool}`, so both read these same values.
"""

from __future__ import annotations

import attrs

from sie.settings._parsers import choice, integer, seconds, text
from sie.settings._spec import Env, setting


@attrs.frozen
class NatsSettings:
    """How to reach NATS; unset URL means no broker (`--role all` uses its in-process transport)."""

    url: str | None = setting(
        Env(
            "SIE_NATS_URL",
            text(),
            "NATS server URL(s), comma-separated. Unset: the gateway answers 503 and the config "
            "service publishes no deltas.",
        ),
        None,
    )
    user: str | None = setting(Env("SIE_NATS_USER", text(), "NATS user name."), None)
    password: str | None = setting(Env("SIE_NATS_PASSWORD", text(), "NATS password.", flag=None, secret=True), None)


@attrs.frozen
class StreamSettings:
    """The `WORK_POOL_{pool}` streams, the DLQ stream, and how lane consumers settle deliveries."""

    storage: str = setting(
        Env(
            "SIE_STREAM_STORAGE",
            choice("memory", "file"),
            "Storage of the work and DEAD_LETTERS streams; an existing stream keeps its own (warned).",
        ),
        "memory",
    )
    replicas: int = setting(
        Env("SIE_STREAM_REPLICAS", integer(minimum=1), "Replica count of the streams on a clustered NATS."),
        1,
    )
    max_age_s: float = setting(
        Env(
            "SIE_STREAM_MAX_AGE_S",
            seconds(positive=True),
            "Work stream `max_age`; keep it above max_deliver x ack_wait so dead letters stay readable.",
        ),
        1800.0,
    )
    max_msgs: int = setting(
        Env(
            "SIE_STREAM_MAX_MSGS",
            integer(minimum=1),
            "Work stream `max_msgs`; publishes beyond it are rejected (discard new), answered with 503.",
        ),
        100_000,
    )
    max_deliver: int = setting(
        Env("SIE_MAX_DELIVER", integer(minimum=1), "Deliveries of one work item before it is dead-lettered."),
        20,
    )
    ack_wait_s: float = setting(
        Env(
            "SIE_ACK_WAIT_S",
            seconds(positive=True),
            "Lane consumer `ack_wait`: an unsettled delivery is redelivered after this long.",
        ),
        30.0,
    )
    nak_delay_s: float = setting(
        Env(
            "SIE_NAK_DELAY_S",
            seconds(),
            "Redelivery delay of a retryable NAK (progress ACKs while loading stay below ack_wait).",
        ),
        5.0,
    )
    oom_nak_delay_s: float = setting(
        Env("SIE_OOM_NAK_DELAY_S", seconds(), "Redelivery delay after a RESOURCE_EXHAUSTED outcome."),
        10.0,
    )
