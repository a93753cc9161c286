"""The telemetry facade (DESIGN §8; STYLE habit 14): instruments render in Prometheus exposition with their
names, bounded labels and values; each `Telemetry` owns its own registry.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sie.telemetry.metrics import OTHER, ConfigOperation, ConfigOutcome, Telemetry


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
