"""The one telemetry facade (DESIGN §8; STYLE habit 14): OpenTelemetry instruments on a per-process
`MeterProvider`, and Prometheus exposition rendered from those same instruments.

A role creates one `Telemetry` and passes it down; nothing here mutates module-level or OpenTelemetry-global
state, so several `Telemetry` objects (one per test) never share series. Exposition goes through
`opentelemetry-exporter-prometheus`'s `PrometheusMetricReader` registered on a private
`prometheus_client.CollectorRegistry` owned by the object, never the global `REGISTRY`.

Label values come only from the enums below; anything else becomes `other`, so wire strings cannot grow the
label space. Why each metric exists is said where it is created.
"""

from __future__ import annotations

import enum
from typing import Final

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest

OTHER: Final = "other"
METER_NAME: Final = "sie"

CONFIG_OPERATIONS: Final = "sie.gateway.config.operations"
CONFIG_BOOTSTRAP_DEGRADED: Final = "sie.gateway.config.bootstrap.degraded"
CONFIG_APPLIED_EPOCH: Final = "sie.gateway.config.applied_epoch"


class ConfigOperation(enum.StrEnum):
    """The `operation` label of sie.gateway.config.operations (seed 000 §4)."""

    BOOTSTRAP = "bootstrap"
    POLL = "poll"
    DELTA = "delta"
    EXPORT = "export"


class ConfigOutcome(enum.StrEnum):
    """The `outcome` label of sie.gateway.config.operations."""

    SUCCESS = "success"
    FAILURE = "failure"
    PARTIAL = "partial"
    UNTRUSTED = "untrusted"
    REJECTED = "rejected"


def bounded(value: object, allowed: type[enum.StrEnum]) -> str:
    """`value` if it is one of `allowed`'s values, else `other`: the only way a label value is chosen."""
    text = str(value)
    return text if text in allowed._value2member_map_ else OTHER


class Telemetry:
    """Owns a MeterProvider, its Prometheus reader and registry, and the typed instruments the roles record."""

    def __init__(self, service_name: str = "sie") -> None:
        self._registry = CollectorRegistry(auto_describe=True)
        self._reader = PrometheusMetricReader(scope_info_enabled=False, registry=self._registry)
        self._provider = MeterProvider(
            metric_readers=[self._reader],
            resource=Resource.create({"service.name": service_name}),
            shutdown_on_exit=False,
        )
        meter = self._provider.get_meter(METER_NAME)
        # Every config-service interaction by kind and result: the rate of failing bootstraps, polls, exports
        # and dropped deltas is how an operator sees the control plane misbehave (seed 000 §4.1–§4.3).
        self._config_operations = meter.create_counter(
            CONFIG_OPERATIONS, unit="{operation}", description="Gateway config-sync operations by outcome."
        )
        # 1 after 10 failed bootstrap attempts or 5 minutes of failing, 0 once one succeeds: the reliable
        # "has an export ever applied?" signal, since /readyz ignores config sync (seed 000 §4.1, §11 caveat 3).
        self._bootstrap_degraded = meter.create_gauge(
            CONFIG_BOOTSTRAP_DEGRADED, unit="1", description="1 while the config bootstrap is degraded."
        )
        # The local ConfigEpoch: compared with sie-config's epoch it shows a replica lagging or ahead (§4.2, §4.3).
        self._applied_epoch = meter.create_gauge(
            CONFIG_APPLIED_EPOCH, unit="{epoch}", description="The gateway's applied config epoch."
        )

    def config_operation(self, operation: ConfigOperation | str, outcome: ConfigOutcome | str) -> None:
        self._config_operations.add(
            1, {"operation": bounded(operation, ConfigOperation), "outcome": bounded(outcome, ConfigOutcome)}
        )

    def set_bootstrap_degraded(self, degraded: bool) -> None:
        self._bootstrap_degraded.set(1 if degraded else 0)

    def set_applied_epoch(self, epoch: int) -> None:
        self._applied_epoch.set(epoch)

    def prometheus_text(self) -> bytes:
        """The current values of every instrument in Prometheus text exposition format."""
        return generate_latest(self._registry)

    def shutdown(self) -> None:
        self._provider.shutdown()
