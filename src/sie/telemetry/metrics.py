"""The one telemetry facade (DESIGN §8; STYLE habit 14): OpenTelemetry instruments on a per-process
`MeterProvider`, Prometheus exposition rendered from those same instruments, and their OTLP push when an endpoint
is configured (`sie.telemetry.export`). Counts and histograms recorded on the request and batch paths aggregate in
plain Python instead (`Tally`, `Distribution`: a dict increment, a bisect) and join both outputs at collection.

A role creates one `Telemetry` and passes it down; nothing here mutates module-level or OpenTelemetry-global
state, so several `Telemetry` objects (one per test, one per in-process worker child) never share series.
Exposition goes through `opentelemetry-exporter-prometheus`'s `PrometheusMetricReader` registered on a private
`prometheus_client.CollectorRegistry` owned by the object, never the global `REGISTRY`.

Label values come only from enums or bounded sets (`bounded`, `ModelLabels`); anything else becomes `other`, so
wire strings cannot grow the label space. Why each metric exists is said where it is created.
"""

from __future__ import annotations

import bisect
import enum
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Final

import attrs
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, HistogramDataPoint, MetricReader
from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.metrics.export import Metric as OtlpMetric
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from sie.settings import TelemetrySettings
from sie.telemetry.export import otlp_metric_reader, service_resource

OTHER: Final = "other"
METER_NAME: Final = "sie"
# Distinct model label values one process admits (seed 001 "bounded telemetry catalog": 256 pairs).
MODEL_LABEL_BUDGET: Final = 256
# Spellings remembered per admitted model (ids arrive in any case, with or without a profile).
_SPELLINGS_PER_MODEL: Final = 4

CONFIG_OPERATIONS: Final = "sie.gateway.config.operations"
CONFIG_BOOTSTRAP_DEGRADED: Final = "sie.gateway.config.bootstrap.degraded"
CONFIG_APPLIED_EPOCH: Final = "sie.gateway.config.applied_epoch"
NATS_CONNECTED: Final = "sie.nats.connected"


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


class ModelLabels:
    """The `model` label of a model id: its catalogue id while `canonical(id)` knows it (None: unknown) and fewer
    than `budget` ids were admitted in this process's lifetime; `other` for anything else (seed 001's bounded
    telemetry catalogue). `canonical=None` trusts every id (ids a worker already resolved) up to the budget."""

    def __init__(self, canonical: Callable[[str], str | None] | None = None, budget: int = MODEL_LABEL_BUDGET) -> None:
        self._canonical = canonical
        self._budget = budget
        self._admitted: set[str] = set()
        self._labels: dict[str, str] = {}

    def __call__(self, model_id: str) -> str:
        label = self._labels.get(model_id)
        if label is not None:
            return label
        known = self._canonical(model_id) if self._canonical is not None else model_id
        if known is None or (known not in self._admitted and len(self._admitted) >= self._budget):
            return OTHER  # never remembered: unknown spellings cannot grow this table
        self._admitted.add(known)
        if len(self._labels) < self._budget * _SPELLINGS_PER_MODEL:
            self._labels[model_id] = known
        return known


class Tally:
    """A counter whose `add` is a dict increment, reported by an ObservableCounter at each collection (a scrape
    or an OTLP push). For counts on the request path: an SDK `Counter.add` spends about 7 µs cleaning and hashing
    its attributes, this about 0.2 µs. `labels` are values in the order of `label_names`, already bounded."""

    def __init__(self, meter: Meter, name: str, unit: str, description: str, label_names: Sequence[str]) -> None:
        self._label_names = tuple(label_names)
        self._totals: dict[tuple[str, ...], float] = {}
        meter.create_observable_counter(name, callbacks=[self._observe], unit=unit, description=description)

    def add(self, labels: tuple[str, ...], amount: float = 1.0) -> None:
        self._totals[labels] = self._totals.get(labels, 0.0) + amount

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        # list() copies the items in one step, so a push thread never sees the dict change under it.
        totals = list(self._totals.items())
        return [Observation(total, dict(zip(self._label_names, labels, strict=True))) for labels, total in totals]


@attrs.define
class _Series:
    """One label set of a Distribution: per-bucket counts (the last one above every bound), sum, count, extremes."""

    counts: list[int]
    total: float = 0.0
    count: int = 0
    low: float = float("inf")
    high: float = float("-inf")


class Distribution:
    """A histogram whose `record` is a bisect and a few additions on plain numbers, for the request and batch
    paths: an SDK `Histogram.record` spends about 21 µs on its attribute set and measurement objects (a
    sequential request paid a quarter of a millisecond for the seven it recorded), this about 1 µs. It is
    reported at each collection as the family the SDK would give: cumulative buckets on `/metrics` (through
    `Distributions.collect`) and an OTLP histogram in each push (`Distributions.otlp_metrics`).

    `labels` are values in the order of `label_names`, already bounded; `bounds` are the explicit bucket bounds
    (a value equal to a bound counts in that bound's bucket, as in OpenTelemetry and Prometheus).
    """

    def __init__(
        self, name: str, unit: str, description: str, label_names: Sequence[str], bounds: Sequence[float]
    ) -> None:
        self.name = name
        self.unit = unit
        self.description = description
        self.label_names = tuple(label_names)
        self.bounds = tuple(bounds)
        self.started_ns = time.time_ns()
        self._series: dict[tuple[str, ...], _Series] = {}

    def record(self, value: float, labels: tuple[str, ...] = ()) -> None:
        series = self._series.get(labels)
        if series is None:
            series = self._series[labels] = _Series([0] * (len(self.bounds) + 1))
        series.counts[bisect.bisect_left(self.bounds, value)] += 1
        series.total += value
        series.count += 1
        if value < series.low:
            series.low = value
        if value > series.high:
            series.high = value

    def snapshot(self) -> list[tuple[tuple[str, ...], _Series]]:
        """A copy of every series (taken in single steps, so a push thread never sees a dict change under it)."""
        return [
            (labels, attrs.evolve(series, counts=list(series.counts))) for labels, series in list(self._series.items())
        ]


def prometheus_name(name: str, unit: str) -> str:
    """The exposition name the OpenTelemetry Prometheus exporter gives an instrument: dots to underscores, and
    `_seconds` for unit `s` (`1` and `{annotation}` units add nothing)."""
    base = name.replace(".", "_")
    if unit == "s":
        return f"{base}_seconds"
    if unit == "1" or (unit.startswith("{") and unit.endswith("}")):
        return base
    raise ValueError(f"no Prometheus suffix known for unit {unit!r} of {name}")


class Distributions:
    """The Distributions of one Telemetry; a prometheus_client collector of their families, and their OTLP
    histogram metrics for the push exporter."""

    def __init__(self) -> None:
        self._all: list[Distribution] = []

    def create(
        self, name: str, unit: str, description: str, label_names: Sequence[str], bounds: Sequence[float]
    ) -> Distribution:
        prometheus_name(name, unit)  # an unknown unit fails here, at start-up, not at the first scrape
        distribution = Distribution(name, unit, description, label_names, bounds)
        self._all.append(distribution)
        return distribution

    def collect(self) -> Iterator[HistogramMetricFamily]:
        for distribution in self._all:
            series = distribution.snapshot()
            if not series:
                continue
            family = HistogramMetricFamily(
                prometheus_name(distribution.name, distribution.unit),
                distribution.description,
                labels=distribution.label_names,
            )
            for labels, values in series:
                cumulative, buckets = 0, []
                for bound, count in zip(distribution.bounds, values.counts, strict=False):
                    cumulative += count
                    buckets.append((str(bound), cumulative))  # `16`, `0.5`: as the SDK's exporter writes them
                buckets.append(("+Inf", values.count))
                family.add_metric(list(labels), buckets, values.total)
            yield family

    def otlp_metrics(self) -> list[OtlpMetric]:
        """Every Distribution with data as a cumulative OTLP histogram, stamped now."""
        now = time.time_ns()
        metrics = []
        for distribution in self._all:
            points = [
                HistogramDataPoint(
                    attributes=dict(zip(distribution.label_names, labels, strict=True)),
                    start_time_unix_nano=distribution.started_ns,
                    time_unix_nano=now,
                    count=values.count,
                    sum=values.total,
                    bucket_counts=values.counts,
                    explicit_bounds=[float(bound) for bound in distribution.bounds],
                    min=values.low,
                    max=values.high,
                )
                for labels, values in distribution.snapshot()
            ]
            if points:
                data = HistogramData(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE)
                metrics.append(OtlpMetric(distribution.name, distribution.description, distribution.unit, data))
        return metrics


class Telemetry:
    """Owns a MeterProvider, its Prometheus reader and registry, the OTLP push reader when configured, and the
    config-sync instruments; the roles' recorders (`sie.telemetry.gateway`, `.sidecar`, `.worker`) create theirs
    on `meter`. With metrics disabled (SIE_METRICS_ENABLED=false) `meter` is a no-op and nothing is exported."""

    def __init__(
        self,
        service_name: str = "sie",
        settings: TelemetrySettings | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> None:
        settings = settings if settings is not None else TelemetrySettings()
        self.enabled = settings.metrics_enabled
        self._registry = CollectorRegistry(auto_describe=True)
        self._provider: MeterProvider | None = None
        self.distributions = Distributions()
        if self.enabled:
            readers: list[MetricReader] = [PrometheusMetricReader(scope_info_enabled=False, registry=self._registry)]
            self._registry.register(self.distributions)
            push = otlp_metric_reader(settings, self.distributions.otlp_metrics, METER_NAME)
            if push is not None:
                readers.append(push)
            self._provider = MeterProvider(
                metric_readers=readers,
                resource=service_resource(settings, service_name, attributes),
                shutdown_on_exit=False,
            )
            self.meter: Meter = self._provider.get_meter(METER_NAME)
        else:
            self.meter = NoOpMeter(METER_NAME)
        meter = self.meter
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

    def observe_connection(self, connected: Callable[[], bool]) -> None:
        """Report `connected()` as sie.nats.connected at each collection."""
        # Whether this process reaches its broker now: 0 means inference answers 503 (gateway), a lane is not
        # consumed (sidecar) or writes are refused (config service), whatever /healthz says.
        self.meter.create_observable_gauge(
            NATS_CONNECTED,
            callbacks=[lambda options: [Observation(1 if connected() else 0)]],
            unit="1",
            description="1 while the process is connected to NATS.",
        )

    def distribution(
        self, name: str, unit: str, description: str, label_names: Sequence[str], bounds: Sequence[float]
    ) -> Distribution:
        """A histogram for the request and batch paths (see Distribution), exported beside the instruments."""
        return self.distributions.create(name, unit, description, label_names, bounds)

    def register(self, collector: Collector) -> None:
        """Serve a prometheus_client collector's families on `/metrics` beside the instruments (the placement
        series, rendered from its snapshot at each scrape; they are not pushed over OTLP)."""
        if self.enabled:
            self._registry.register(collector)

    def prometheus_text(self) -> bytes:
        """The current values of every instrument in Prometheus text exposition format."""
        return generate_latest(self._registry)

    def shutdown(self) -> None:
        """Push the last values (when pushing) and stop the readers."""
        if self._provider is not None:
            self._provider.shutdown()
