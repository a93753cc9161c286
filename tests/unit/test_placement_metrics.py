"""Placement's Prometheus exposition: a snapshot rendered, parsed back with prometheus_client's parser, and
checked by name, labels and value; round_robin exports no inflight work; a child hosting nothing is absent."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sie.placement.metrics import PlacementCollector
from sie.placement.policy import LPT_PACKING, ROUND_ROBIN, PlacementPolicy
from sie.placement.snapshot import PlacementSnapshot
from support.placement_fakes import BGE, MINI, sample_snapshot

TOLERANCE = 1e-9


def render(snapshot: Callable[[], PlacementSnapshot]) -> bytes:
    """The exposition of a private registry holding one PlacementCollector, as a role's `/metrics` serves it."""
    registry = prometheus_client.CollectorRegistry()
    registry.register(PlacementCollector(snapshot))
    return prometheus_client.generate_latest(registry)


def scrape(snapshot: PlacementSnapshot) -> dict[str, dict[tuple[str, frozenset], float]]:
    """{family name: {(sample name, labels): value}}."""
    text = render(lambda: snapshot).decode()
    return {
        family.name: {(sample.name, frozenset(sample.labels.items())): sample.value for sample in family.samples}
        for family in text_string_to_metric_families(text)
    }


def labels(**values: str) -> frozenset:
    return frozenset(values.items())


@pytest.fixture
def families() -> dict[str, dict[tuple[str, frozenset], float]]:
    return scrape(sample_snapshot(PlacementPolicy(mode=LPT_PACKING, work_basis="items")))


def test_model_series(families) -> None:
    replicas = families["sie_placement_model_replicas"]
    assert replicas == {
        ("sie_placement_model_replicas", labels(model=BGE)): 2.0,
        ("sie_placement_model_replicas", labels(model=MINI)): 1.0,
    }
    assert families["sie_placement_model_fill_quantum"][
        ("sie_placement_model_fill_quantum", labels(model=MINI))
    ] == pytest.approx(64, abs=TOLERANCE)
    assert families["sie_placement_model_utilization"][
        ("sie_placement_model_utilization", labels(model=BGE))
    ] == pytest.approx(0.6, abs=TOLERANCE)


def test_replica_series_name_model_worker_and_device(families) -> None:
    worker1 = labels(model=BGE, worker="worker-1", device="cuda:1")
    assert families["sie_placement_weight"][("sie_placement_weight", worker1)] == pytest.approx(0.5, abs=TOLERANCE)
    outstanding = families["sie_placement_replica_outstanding_items"]
    assert outstanding[("sie_placement_replica_outstanding_items", worker1)] == 16.0
    routed = families["sie_placement_replica_routed"]
    assert routed[("sie_placement_replica_routed_total", worker1)] == 8.0
    assert routed[("sie_placement_replica_routed_total", labels(model=MINI, worker="worker-0", device="cuda:0"))] == 4.0
    assert families["sie_placement_replica_routed_items"][("sie_placement_replica_routed_items_total", worker1)] == 250
    # three replicas in all; worker-2 hosts nothing and has no replica series
    for name in ("sie_placement_weight", "sie_placement_replica_outstanding_items", "sie_placement_replica_routed"):
        assert len(families[name]) == 3
        assert all(dict(label_set)["worker"] != "worker-2" for _, label_set in families[name])


def test_worker_series(families) -> None:
    ready = families["sie_placement_worker_ready"]
    assert ready == {
        ("sie_placement_worker_ready", labels(worker="worker-0", device="cuda:0")): 1.0,
        ("sie_placement_worker_ready", labels(worker="worker-1", device="cuda:1")): 1.0,
        ("sie_placement_worker_ready", labels(worker="worker-2", device="cuda:2")): 0.0,
    }
    compute = families["sie_worker_compute_seconds"]
    assert compute[("sie_worker_compute_seconds_total", labels(worker="worker-0", device="cuda:0"))] == 120.5
    inflight = families["sie_placement_worker_inflight_work"]
    assert inflight == {
        ("sie_placement_worker_inflight_work", labels(worker="worker-0", device="cuda:0", basis="items")): 0.75,
        ("sie_placement_worker_inflight_work", labels(worker="worker-1", device="cuda:1", basis="items")): 0.25,
    }


def test_repacks_by_trigger(families) -> None:
    assert families["sie_placement_repacks"] == {
        ("sie_placement_repacks_total", labels(trigger="startup")): 1.0,
        ("sie_placement_repacks_total", labels(trigger="compute")): 2.0,
    }


def test_batch_items_histogram(families) -> None:
    samples = families["sie_worker_batch_items"]
    base = {"model": BGE, "worker": "worker-0", "device": "cuda:0"}
    buckets = {dict(label_set)["le"]: value for (name, label_set), value in samples.items() if name.endswith("_bucket")}
    assert buckets == {"1.0": 2.0, "8.0": 6.0, "32.0": 10.0, "+Inf": 10.0}
    assert samples[("sie_worker_batch_items_count", labels(**base))] == 10.0
    assert samples[("sie_worker_batch_items_sum", labels(**base))] == 120.0


def test_round_robin_exports_no_inflight_work() -> None:
    families = scrape(sample_snapshot(PlacementPolicy(mode=ROUND_ROBIN)))
    assert "sie_placement_worker_inflight_work" not in families
    assert "sie_placement_worker_ready" in families


def test_the_snapshot_is_read_at_each_scrape_into_a_private_registry() -> None:
    snapshot = sample_snapshot(PlacementPolicy(mode=LPT_PACKING))
    current = [snapshot]
    assert b"worker-1" in render(lambda: current[0])
    # worker-1 drops out: its series stop being emitted rather than freezing at their last value
    models = tuple(attrs.evolve(model, replicas=model.replicas[:1]) for model in snapshot.models)
    current[0] = attrs.evolve(snapshot, children=snapshot.children[:1], models=models)
    assert b"worker-1" not in render(lambda: current[0])
    assert b"sie_placement" not in prometheus_client.generate_latest(prometheus_client.REGISTRY)
