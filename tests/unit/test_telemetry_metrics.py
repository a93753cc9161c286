"""The telemetry facade (DESIGN §8; STYLE habit 14): instruments render in Prometheus exposition with their
names, bounded labels and values; each `Telemetry` owns its own registry.
"""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sie.settings import TelemetrySettings
from sie.telemetry.metrics import OTHER, ConfigOperation, ConfigOutcome, ModelLabels, Tally, Telemetry
from sie.telemetry.worker import LoadOutcome, WorkerMetrics


def samples(telemetry: Telemetry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = telemetry.prometheus_text().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.name.startswith("target_info")
    }


def operations(operation: str, outcome: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return "sie_gateway_config_operations_total", frozenset({("operation", operation), ("outcome", outcome)})


def test_instruments_render_with_names_labels_and_values() -> None:
    telemetry = Telemetry()
    telemetry.config_operation(ConfigOperation.BOOTSTRAP, ConfigOutcome.FAILURE)
    telemetry.config_operation(ConfigOperation.BOOTSTRAP, ConfigOutcome.FAILURE)
    telemetry.config_operation("delta", "untrusted")
    telemetry.set_bootstrap_degraded(True)
    telemetry.set_applied_epoch(42)
    assert samples(telemetry) == {
        operations("bootstrap", "failure"): 2.0,
        operations("delta", "untrusted"): 1.0,
        ("sie_gateway_config_bootstrap_degraded", frozenset()): 1.0,
        ("sie_gateway_config_applied_epoch", frozenset()): 42.0,
    }
    text = telemetry.prometheus_text().decode()
    assert "# TYPE sie_gateway_config_operations_total counter" in text
    assert "# TYPE sie_gateway_config_bootstrap_degraded gauge" in text
    assert "# TYPE sie_gateway_config_applied_epoch gauge" in text


def test_unknown_label_values_become_other_and_add_no_new_values() -> None:
    telemetry = Telemetry()
    for wire in ("sie.config.models._all", "org/some-model", "POLL", ""):
        telemetry.config_operation(wire, wire)
    telemetry.config_operation(ConfigOperation.POLL, "timeout")
    assert samples(telemetry) == {operations(OTHER, OTHER): 4.0, operations("poll", OTHER): 1.0}


def test_gauges_move_both_ways() -> None:
    telemetry = Telemetry()
    telemetry.set_bootstrap_degraded(True)
    telemetry.set_bootstrap_degraded(False)
    telemetry.set_applied_epoch(9)
    telemetry.set_applied_epoch(3)
    assert samples(telemetry) == {
        ("sie_gateway_config_bootstrap_degraded", frozenset()): 0.0,
        ("sie_gateway_config_applied_epoch", frozenset()): 3.0,
    }


def test_two_telemetry_objects_are_independent() -> None:
    first, second = Telemetry(), Telemetry()
    first.config_operation(ConfigOperation.EXPORT, ConfigOutcome.SUCCESS)
    second.set_applied_epoch(5)
    assert samples(first) == {operations("export", "success"): 1.0}
    assert samples(second) == {("sie_gateway_config_applied_epoch", frozenset()): 5.0}
    assert b"sie_gateway_config" not in generate_latest(REGISTRY)  # the global registry is never used
    first.shutdown()
    assert samples(second) == {("sie_gateway_config_applied_epoch", frozenset()): 5.0}


def test_model_labels_keep_catalogue_ids_and_collapse_the_rest() -> None:
    catalogue = {"baai/bge-m3": "BAAI/bge-m3", "org/small": "org/small"}
    labels = ModelLabels(lambda model_id: catalogue.get(model_id.lower()), budget=1)
    assert labels("BAAI/bge-m3") == "BAAI/bge-m3"
    assert labels("baai/BGE-M3") == "BAAI/bge-m3"  # another spelling of an admitted id
    assert labels("org/small") == OTHER  # known, but over the budget of one
    assert labels("../../etc/passwd") == OTHER
    assert [labels(f"wire-{i}") for i in range(3)] == [OTHER] * 3


def test_tallies_count_by_label_values_and_render_as_counters() -> None:
    telemetry = Telemetry()
    tally = Tally(telemetry.meter, "sie.test.events", "{event}", "Events.", ("kind",))
    tally.add(("a",))
    tally.add(("a",), 2)
    tally.add(("b",))
    assert samples(telemetry) == {
        ("sie_test_events_total", frozenset({("kind", "a")})): 3.0,
        ("sie_test_events_total", frozenset({("kind", "b")})): 1.0,
    }


def test_disabled_telemetry_records_and_renders_nothing() -> None:
    telemetry = Telemetry(settings=TelemetrySettings(metrics_enabled=False))
    Tally(telemetry.meter, "sie.test.events", "{event}", "Events.", ("kind",)).add(("a",))
    telemetry.config_operation(ConfigOperation.POLL, ConfigOutcome.SUCCESS)
    assert telemetry.prometheus_text() == b""


def test_worker_series_read_the_holder_at_each_collection() -> None:
    telemetry = Telemetry()
    metrics = WorkerMetrics(telemetry)

    class Holder:
        loaded_models = ["m1"]
        loading_models = ["m2"]
        memory_bytes = 100
        memory_budget_bytes = 1000

        def model_memory_bytes(self, model_id: str) -> int:
            return 100 if model_id == "m1" else 0

        def generation_sequences(self) -> dict[str, tuple[int, int]]:
            return {"m1": (3, 1)}

    holder = Holder()
    metrics.watch(holder)
    metrics.load_finished("m1", LoadOutcome.LOADED, 1.5)
    metrics.evicted("m0")
    found = samples(telemetry)
    assert found[("sie_worker_model_state", frozenset({("model", "m1"), ("state", "loaded")}))] == 1.0
    assert found[("sie_worker_model_state", frozenset({("model", "m2"), ("state", "loading")}))] == 1.0
    assert found[("sie_worker_memory_bytes", frozenset({("kind", "budget")}))] == 1000.0
    assert found[("sie_worker_model_memory_bytes", frozenset({("model", "m1")}))] == 100.0
    assert found[("sie_worker_model_loads_total", frozenset({("model", "m1"), ("outcome", "loaded")}))] == 1.0
    assert found[("sie_worker_model_evictions_total", frozenset({("model", "m0")}))] == 1.0
    assert found[("sie_worker_generation_sequences", frozenset({("model", "m1"), ("state", "decoding")}))] == 3.0
    assert found[("sie_worker_generation_sequences", frozenset({("model", "m1"), ("state", "waiting")}))] == 1.0
    holder.loaded_models = ["m1", "m2"]
    holder.loading_models = []
    assert samples(telemetry)[("sie_worker_models_loaded", frozenset())] == 2.0
    assert "sie_worker_model_load_duration_seconds_bucket" in metrics.text()


def _family_samples(telemetry: Telemetry, name: str) -> list[tuple[str, dict[str, str], float]]:
    text = telemetry.prometheus_text().decode()
    (family,) = [family for family in text_string_to_metric_families(text) if family.name == name]
    return [(sample.name.removeprefix(name), sample.labels, sample.value) for sample in family.samples]


def test_a_distribution_renders_as_the_sdk_histogram_would() -> None:
    telemetry = Telemetry()
    bounds = (16, 32, 0.5 * 128)
    sdk = telemetry.meter.create_histogram(
        "sie.test.sdk", unit="s", description="d", explicit_bucket_boundaries_advisory=bounds
    )
    local = telemetry.distribution("sie.test.local", "s", "d", ("model",), bounds)
    for value in (1, 16, 16.5, 40, 64, 1000):  # a value on a bound counts in that bound's bucket
        sdk.record(value, {"model": "m"})
        local.record(value, ("m",))
    expected = _family_samples(telemetry, "sie_test_sdk_seconds")
    assert _family_samples(telemetry, "sie_test_local_seconds") == expected
    assert ("_bucket", {"model": "m", "le": "16"}, 2.0) in expected
    assert ("_count", {"model": "m"}, 6.0) in expected


def test_distributions_are_pushed_as_otlp_histograms() -> None:
    telemetry = Telemetry()
    tokens = telemetry.distribution("sie.test.tokens", "{token}", "Tokens.", ("model",), (16, 32))
    telemetry.distribution("sie.test.unused", "s", "Never recorded.", ("model",), (1.0,))
    tokens.record(20, ("a",))
    tokens.record(40, ("a",))
    (metric,) = telemetry.distributions.otlp_metrics()
    (point,) = metric.data.data_points
    assert (metric.name, metric.unit) == ("sie.test.tokens", "{token}")
    assert point.attributes == {"model": "a"}
    assert (point.count, point.sum, point.min, point.max) == (2, 60, 20, 40)
    assert (list(point.bucket_counts), list(point.explicit_bounds)) == ([0, 1, 1], [16.0, 32.0])


def test_a_distribution_unit_without_a_prometheus_name_fails_at_creation() -> None:
    with pytest.raises(ValueError, match="unit 'By'"):
        Telemetry().distribution("sie.test.bytes", "By", "Bytes.", (), (1.0,))
