"""Prometheus exposition of placement (seed 002 "Observability"): every series is read from a snapshot callable at
scrape time, so a scrape never lags a probe round and a child that hosts nothing simply stops being emitted.

`PlacementCollector` is registered on the role's telemetry registry (served on its `/metrics`), never the global
`REGISTRY`. Label values are worker
names, devices, configured model ids, repack triggers and the work basis: bounded by the pod's configuration,
never taken from request strings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from sie.placement.policy import ROUND_ROBIN
from sie.placement.snapshot import BatchSizes, PlacementSnapshot

_REPLICA_LABELS = ("model", "worker", "device")
_WORKER_LABELS = ("worker", "device")


class PlacementCollector:
    """A prometheus_client collector that renders `snapshot()` afresh at each scrape."""

    def __init__(self, snapshot: Callable[[], PlacementSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snapshot = self._snapshot()
        yield from _model_families(snapshot)
        yield from _replica_families(snapshot)
        yield from _worker_families(snapshot)
        yield _repacks(snapshot)
        yield from _compaction(snapshot)
        yield _batch_items(snapshot.batch_sizes)


def _model_families(snapshot: PlacementSnapshot) -> tuple[Metric, ...]:
    # Whether the replica count a model should have is the one it has (a model short of ready children shows here).
    replicas = GaugeMetricFamily("sie_placement_model_replicas", "Replicas each model is placed on.", labels=["model"])
    # The quantum fill_least/fill_rr hand a replica before moving on: what "deep batches" means per model.
    quantum = GaugeMetricFamily(
        "sie_placement_model_fill_quantum", "Effective fill quantum of each model, in items.", labels=["model"]
    )
    # The demand estimate repacks place by (seed: gateway_model_utilization).
    utilization = GaugeMetricFamily(
        "sie_placement_model_utilization",
        "Estimated demand of each model in compute-seconds per fleet compute-second.",
        labels=["model"],
    )
    for model in snapshot.models:
        replicas.add_metric([model.model_id], len(model.replicas))
        quantum.add_metric([model.model_id], model.fill_quantum)
        utilization.add_metric([model.model_id], model.demand)
    return replicas, quantum, utilization


def _replica_families(snapshot: PlacementSnapshot) -> tuple[Metric, ...]:
    # The share of a model's traffic each replica is meant to take.
    weight = GaugeMetricFamily(
        "sie_placement_weight", "Placement weight of each model on each worker.", labels=_REPLICA_LABELS
    )
    # Items in flight per replica, in the quantum's denomination (summed batch sizes).
    outstanding = GaugeMetricFamily(
        "sie_placement_replica_outstanding_items", "Items in flight on each replica.", labels=_REPLICA_LABELS
    )
    # Whether every replica is actually used: a flat series here is an idle replica.
    routed = CounterMetricFamily(
        "sie_placement_replica_routed", "Batches routed to each replica since start.", labels=_REPLICA_LABELS
    )
    routed_items = CounterMetricFamily(
        "sie_placement_replica_routed_items", "Items routed to each replica since start.", labels=_REPLICA_LABELS
    )
    for model in snapshot.models:
        for replica in model.replicas:
            labels = [model.model_id, replica.child, replica.device]
            weight.add_metric(labels, replica.weight)
            outstanding.add_metric(labels, replica.outstanding_items)
            routed.add_metric(labels, replica.routed_batches)
            routed_items.add_metric(labels, replica.routed_items)
    return weight, outstanding, routed, routed_items


def _worker_families(snapshot: PlacementSnapshot) -> Iterator[Metric]:
    ready = GaugeMetricFamily("sie_placement_worker_ready", "1 while a worker child is ready.", labels=_WORKER_LABELS)
    # Device-seconds each child really consumed: rate() of it is what the routing actually balanced.
    compute = CounterMetricFamily(
        "sie_worker_compute_seconds", "Device-seconds each worker child spent running batches.", labels=_WORKER_LABELS
    )
    for child in snapshot.children:
        ready.add_metric([child.name, child.device], 1.0 if child.ready else 0.0)
        compute.add_metric([child.name, child.device], child.compute_seconds_total)
    yield ready
    yield compute
    # round_robin tracks no load, so it exports nothing here (seed 002 "Observability").
    if snapshot.policy.mode == ROUND_ROBIN:
        return
    # The load the router compares when it picks a replica, so a decision can be explained after the fact.
    inflight = GaugeMetricFamily(
        "sie_placement_worker_inflight_work",
        "In-flight work per worker child, in the unit of `basis`.",
        labels=[*_WORKER_LABELS, "basis"],
    )
    hosting = {replica.child for model in snapshot.models for replica in model.replicas}
    for child in snapshot.children:
        if child.name in hosting:
            inflight.add_metric([child.name, child.device, snapshot.policy.work_basis], child.inflight_work)
    yield inflight


def _repacks(snapshot: PlacementSnapshot) -> Metric:
    repacks = CounterMetricFamily("sie_placement_repacks", "Repacks by what triggered them.", labels=["trigger"])
    for trigger, count in snapshot.repacks_total:
        repacks.add_metric([trigger], count)
    return repacks


def _compaction(snapshot: PlacementSnapshot) -> tuple[Metric, ...]:
    # What compaction gave back: a repack that moves models and no unloads here leaves memory behind.
    state = snapshot.compaction
    compactions = CounterMetricFamily("sie_placement_compactions", "Compactions started after repacks.")
    compactions.add_metric([], state.compactions_total)
    unloads = CounterMetricFamily(
        "sie_placement_compaction_unloads", "Models unloaded from children that no longer hold a replica of them."
    )
    unloads.add_metric([], state.unloads_total)
    freed = CounterMetricFamily("sie_placement_compaction_freed_bytes", "Weight bytes compaction unloaded.")
    freed.add_metric([], state.freed_bytes_total)
    return compactions, unloads, freed


def _batch_items(batch_sizes: tuple[BatchSizes, ...]) -> Metric:
    # How deep the batches each child runs are: the coalescing lpt_packing exists to deepen.
    histogram = HistogramMetricFamily(
        "sie_worker_batch_items", "Items per batch run by each worker child.", labels=_REPLICA_LABELS
    )
    for sizes in batch_sizes:
        buckets = [(floatToGoString(bound), float(count)) for bound, count in sizes.buckets]
        if not buckets or buckets[-1][0] != "+Inf":
            buckets.append(("+Inf", float(sizes.count)))
        histogram.add_metric([sizes.model_id, sizes.child, sizes.device], buckets, float(sizes.total_items))
    return histogram


__all__ = ["PlacementCollector"]
