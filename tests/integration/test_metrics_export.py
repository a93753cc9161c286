"""The OTLP/HTTP push of the metrics facade as a collector receives it: the same instruments `/metrics` shows, with
the service name and resource attributes of the settings, to the base endpoint's `/v1/metrics` or to the
metrics-specific URL as given; the last values go out at shutdown."""

from __future__ import annotations

import pytest

from sie.settings import TelemetrySettings
from sie.telemetry.gateway import AdmissionDecision, GatewayMetrics
from sie.telemetry.metrics import ModelLabels, Telemetry
from support.otlp import METRICS_PATH, otlp_receiver


@pytest.mark.parametrize("variable", ["base", "metrics"])
def test_instruments_are_pushed_with_the_configured_resource(variable: str) -> None:
    with otlp_receiver() as receiver:
        endpoint = (
            {"otlp_endpoint": receiver.url}
            if variable == "base"
            else {"otlp_metrics_endpoint": f"{receiver.url}{METRICS_PATH}"}
        )
        settings = TelemetrySettings(
            resource_attributes=(("deployment.environment", "test"), ("service.namespace", "sie")), **endpoint
        )
        telemetry = Telemetry("sie-gateway", settings)
        metrics = GatewayMetrics(telemetry, ModelLabels())
        metrics.admission(AdmissionDecision.QUEUE_FULL)
        metrics.admission(AdmissionDecision.QUEUE_FULL)
        metrics.http.request("/v1/encode/{model:path}", "m", 200, 0.012)
        telemetry.set_applied_epoch(4)
        telemetry.shutdown()  # pushes what is recorded
        points = {(point.name, tuple(sorted(point.attributes.items()))): point for point in receiver.points()}
    assert receiver.post_count(METRICS_PATH) >= 1
    admissions = points[("sie.gateway.admission.decisions", (("decision", "queue_full"),))]
    assert admissions.value == 2.0
    assert admissions.service == "sie-gateway"
    assert admissions.resource["deployment.environment"] == "test" and admissions.resource["service.namespace"] == "sie"
    labels = (("model", "m"), ("route", "/v1/encode/{model:path}"), ("status", "200"))
    duration = points[("sie.gateway.request.duration", labels)]
    assert (duration.value, duration.total, duration.unit) == (1.0, pytest.approx(0.012), "s")
    assert points[("sie.gateway.config.applied_epoch", ())].value == 4.0


def test_the_service_name_setting_wins_and_nothing_is_pushed_without_an_endpoint() -> None:
    with otlp_receiver() as receiver:
        named = Telemetry("sie-gateway", TelemetrySettings(otlp_endpoint=receiver.url, service_name="edge-7"))
        named.set_applied_epoch(1)
        named.shutdown()
        silent = Telemetry("sie-gateway", TelemetrySettings())
        silent.set_applied_epoch(2)
        silent.shutdown()
        services = {point.service for point in receiver.points()}
    assert services == {"edge-7"}
