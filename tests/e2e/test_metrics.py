"""`/metrics` of real processes as an operator's tools see it: a real Prometheus scraping a distributed deployment's
gateway and sidecar probe port (the sidecar merging its worker child's series) watches the series move under
traffic; `promtool check metrics` passes on the gateway's, the sidecar's, the config service's and the `all` role's
exposition; the `all` role pushes the same instruments over OTLP/HTTP to a collector, with the configured resource.
Marked slow: real processes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from launcher import MINILM, Cluster, RoleProcess, free_port
from support.otlp import OtlpReceiver, ReceivedPoint, otlp_grpc_receiver, otlp_receiver
from support.polling import holds_within
from support.prometheus import Prometheus, prometheus, promtool_problems

pytestmark = pytest.mark.slow

ENCODE_ROUTE = "/v1/encode/{model:path}"
WAIT_S = 60.0


def _encode(url: str, text: str = "a sentence to count") -> None:
    response = httpx.post(f"{url}/v1/encode/{MINILM}", json={"items": [{"text": text}]}, timeout=60)
    assert response.status_code == 200, response.text


def _host_port(url: str) -> str:
    return url.removeprefix("http://")


def _rises_to(server: Prometheus, expr: str, at_least: float, logs: str) -> None:
    if not holds_within(lambda: server.total(expr) >= at_least, WAIT_S, interval_s=0.5):
        raise AssertionError(f"{expr} stayed at {server.total(expr)}, expected >= {at_least}\n{server.log()}\n{logs}")


def test_prometheus_sees_the_gateway_and_sidecar_series_move_under_traffic(cluster: Cluster, tmp_path: Path) -> None:
    targets = {"gateway": _host_port(cluster.url), "sidecar": _host_port(cluster.probe_url)}
    with prometheus(tmp_path, targets) as server:
        _rises_to(server, 'up{job=~"gateway|sidecar"}', 2, cluster.logs())
        encode = f'sie_gateway_requests_total{{job="gateway",route="{ENCODE_ROUTE}",model="{MINILM}",status="200"}}'
        batches = f'sie_worker_batches_total{{job="sidecar",model="{MINILM}",result="ok"}}'
        _rises_to(server, encode, 1, cluster.logs())  # the cluster's readiness pings are in already
        requests_before, batches_before = server.total(encode), server.total(batches)
        for index in range(5):
            _encode(cluster.url, f"sentence number {index}")
        _rises_to(server, encode, requests_before + 5, cluster.logs())
        _rises_to(server, batches, batches_before + 1, cluster.logs())
        admitted = 'sie_gateway_admission_decisions_total{job="gateway",decision="admitted"}'
        _rises_to(server, admitted, requests_before + 5, cluster.logs())
        stored = 'sie_gateway_publish_acks_total{job="gateway",outcome="stored"}'  # the drained publish ACKs
        _rises_to(server, stored, requests_before + 5, cluster.logs())
        latency = f'sie_gateway_request_duration_seconds_count{{job="gateway",route="{ENCODE_ROUTE}"}}'
        _rises_to(server, latency, requests_before + 5, cluster.logs())
        # The worker child's own series, fetched by the sidecar over IPC and labelled with its name and device.
        loaded = f'sie_worker_model_loads_total{{job="sidecar",worker="worker-0",device="cpu",model="{MINILM}"}}'
        _rises_to(server, loaded, 1, cluster.logs())
        _rises_to(server, 'sie_worker_ipc_bytes_total{job="sidecar",direction="received"}', 1, cluster.logs())
        _rises_to(server, 'sie_nats_connected{job=~"gateway|sidecar"}', 2, cluster.logs())
        _rises_to(server, 'sie_gateway_routing_ready{job="gateway"}', 1, cluster.logs())  # what /readyz no longer says
        lane = 'sie_gateway_lane_queue_depth{job="gateway",pool="default"}'
        if not holds_within(lambda: bool(server.query(lane)), WAIT_S, interval_s=0.5):
            raise AssertionError(f"no lane queue depth series\n{server.log()}")


def test_gateway_and_sidecar_exposition_passes_promtool(cluster: Cluster) -> None:
    _encode(cluster.url)
    for url in (cluster.url, cluster.probe_url):
        response = httpx.get(f"{url}/metrics", timeout=30)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert promtool_problems(response.text) == "", url


def test_config_service_exposition_counts_its_requests_and_passes_promtool(tmp_path: Path) -> None:
    port = free_port()
    server = RoleProcess("config", ["--host", "127.0.0.1", "--port", str(port)], {}, tmp_path / "config.log")
    url = f"http://127.0.0.1:{port}"
    try:
        server.wait_http_ready(f"{url}/readyz")
        assert httpx.get(f"{url}/v1/configs/models/{MINILM}", timeout=10).status_code == 200
        text = httpx.get(f"{url}/metrics", timeout=10).text
    finally:
        server.stop()
    assert promtool_problems(text) == ""
    route = "/v1/configs/models/{model_id:path}"
    assert f'sie_config_requests_total{{model="{MINILM}",route="{route}",status="200"}} 1.0' in text


@contextmanager
def _pushing_all_role(root: Path, receiver: OtlpReceiver) -> Iterator[tuple[RoleProcess, str]]:
    port = free_port()
    env = {
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"{receiver.url}/v1/metrics",
        "OTEL_METRIC_EXPORT_INTERVAL": "200",
        "OTEL_SERVICE_NAME": "sie-under-test",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=e2e,cloud.region=local",
    }
    args = ["--host", "127.0.0.1", "--port", str(port), "--preload", MINILM]
    server = RoleProcess("all", args, env, root / "all.log")
    try:
        server.wait_http_ready(f"http://127.0.0.1:{port}/readyz")
        yield server, f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def _latest(points: list[ReceivedPoint], name: str, **attributes: str) -> ReceivedPoint | None:
    matching = [p for p in points if p.name == name and attributes.items() <= p.attributes.items()]
    return matching[-1] if matching else None


def test_all_role_pushes_its_instruments_over_otlp_and_its_exposition_passes_promtool(tmp_path: Path) -> None:
    with otlp_receiver() as receiver, _pushing_all_role(tmp_path, receiver) as (server, url):
        for index in range(3):
            _encode(url, f"pushed sentence {index}")
        text = httpx.get(f"{url}/metrics", timeout=30).text
        assert promtool_problems(text) == ""
        requests = {"route": ENCODE_ROUTE, "model": MINILM, "status": "200"}

        def pushed() -> bool:
            point = _latest(receiver.points(), "sie.gateway.requests", **requests)
            return point is not None and point.value >= 3

        if not holds_within(pushed, WAIT_S, interval_s=0.2):
            raise AssertionError(f"no pushed request count of 3: {receiver.posts}\n{server.log()}")
        points = receiver.points()
        request = _latest(points, "sie.gateway.requests", **requests)
        assert request is not None and request.service == "sie-under-test"
        assert request.resource["deployment.environment"] == "e2e" and request.resource["cloud.region"] == "local"
        duration = _latest(points, "sie.gateway.request.duration", **requests)
        assert duration is not None and duration.unit == "s" and duration.value >= 3
        # The worker child pushes its own series with its name and device as resource attributes.
        load = _latest(points, "sie.worker.model.loads", model=MINILM, outcome="loaded")
        assert load is not None and load.resource["sie.worker"] == "worker-0" and load.resource["sie.device"] == "cpu"


def test_with_the_grpc_protocol_metrics_and_spans_go_to_the_collectors_grpc_services(tmp_path: Path) -> None:
    """OTEL_EXPORTER_OTLP_PROTOCOL=grpc: the `all` role pushes its metrics and exports its spans to the OTLP gRPC
    services at OTEL_EXPORTER_OTLP_ENDPOINT itself (no /v1 paths), with the sampler the OTEL variables name."""
    port = free_port()
    with otlp_grpc_receiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_METRIC_EXPORT_INTERVAL": "200", "SIE_TRACING_ENABLED": "true",
            "OTEL_TRACES_SAMPLER": "parentbased_always_on", "OTEL_SERVICE_NAME": "sie-grpc",
        }  # fmt: skip
        args = ["--host", "127.0.0.1", "--port", str(port), "--preload", MINILM]
        server = RoleProcess("all", args, env, tmp_path / "all.log")
        try:
            url = f"http://127.0.0.1:{port}"
            server.wait_http_ready(f"{url}/readyz")
            _encode(url, "sent while the collector listens on gRPC")

            def arrived() -> bool:
                point = _latest(receiver.points(), "sie.gateway.requests", route=ENCODE_ROUTE, status="200")
                return point is not None and any(span.name == "gateway.request" for span in receiver.spans())

            if not holds_within(arrived, WAIT_S, interval_s=0.2):
                raise AssertionError(f"nothing over gRPC: {receiver.posts}\n{server.log()}")
        finally:
            server.stop()
    assert "gateway.request" in {span.name for span in receiver.spans() if span.service == "sie-grpc"}


def exposed_series(text: str) -> set[str]:
    """The sample names an exposition declares (`# TYPE` lines; a histogram's `_bucket`, `_sum` and `_count`)."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "histogram" else {name}
    return names


def test_every_series_the_alerts_read_exists_in_a_real_scrape(cluster: Cluster) -> None:
    """The chart's alerting rules read series a running gateway or sidecar exposes (a renamed instrument would
    leave an alert that never fires)."""
    from deploy.test_alerts import rule_series

    _encode(cluster.url)
    _leave_pending_demand(cluster.url)
    _assert_scrapes_expose(rule_series(), (cluster.url, cluster.probe_url))


def _leave_pending_demand(url: str) -> None:
    """A request for the queue pool no worker serves leaves pending demand (its gauge reports only while some
    exists)."""
    unserved = httpx.post(f"{url}/v1/encode/{MINILM}", json={"items": [{"text": "x"}]},
                          headers={"X-SIE-Pool": "elsewhere"}, timeout=30)  # fmt: skip
    assert unserved.status_code == 503, unserved.text


def _assert_scrapes_expose(expected: set[str], urls: tuple[str, ...]) -> None:
    """Every series of `expected` is declared by one of the `/metrics` of `urls` within WAIT_S."""
    exposed: set[str] = set()

    def all_exposed() -> bool:  # the lane depths are read in the background every few seconds
        for url in urls:
            exposed.update(exposed_series(httpx.get(f"{url}/metrics", timeout=30).text))
        return expected <= exposed

    assert holds_within(all_exposed, WAIT_S, interval_s=0.5), sorted(expected - exposed)


# Series a healthy deployment declares only after an event it may never see, left out of the dashboards' check.
AFTER_RARE_EVENTS = {
    # counted from a worker child's first eviction (its memory budget or SIE_MAX_LOADED_MODELS reached): the shared
    # cluster's worker holds one model and never evicts
    "sie_worker_model_evictions_total",
}
WARM_POOL = {"name": "warm-floor", "gpus": {"l4": 1}, "minimum_worker_count": 1, "ttl_seconds": 300}


@contextmanager
def _config_synced_gateway(cluster: Cluster, root: Path) -> Iterator[tuple[str, str]]:
    """A config service and a second gateway on the cluster's broker syncing with it (the shared cluster's gateway
    has no config service, so it counts no config operations): their base URLs."""
    config_port, gateway_port = free_port(), free_port()
    config_url, gateway_url = f"http://127.0.0.1:{config_port}", f"http://127.0.0.1:{gateway_port}"
    config = RoleProcess("config", ["--host", "127.0.0.1", "--port", str(config_port)], {}, root / "config.log")
    gateway = None
    try:
        config.wait_http_ready(f"{config_url}/readyz")
        env = {"SIE_NATS_URL": cluster.nats_url, "SIE_CONFIG_SERVICE_URL": config_url}
        args = ["--host", "127.0.0.1", "--port", str(gateway_port)]
        gateway = RoleProcess("gateway", args, env, root / "gateway.log")
        gateway.wait_http_ready(f"{gateway_url}/readyz")
        yield config_url, gateway_url
    finally:
        if gateway is not None:
            gateway.stop()
        config.stop()


def test_every_series_the_dashboards_read_exists_in_a_real_scrape(cluster: Cluster, tmp_path: Path) -> None:
    """The chart's Grafana dashboards read series a running gateway, sidecar or config service exposes (a renamed
    instrument would leave a panel empty). Provoked first: pending demand, a warm floor (a pool keeping a worker
    warm on a lane nobody serves) and config operations (a gateway syncing with a config service)."""
    from deploy.test_dashboards import dashboard_series

    _encode(cluster.url)
    _leave_pending_demand(cluster.url)
    created = httpx.post(f"{cluster.url}/v1/pools", json=WARM_POOL, timeout=10)
    assert created.status_code == 201, created.text
    try:
        with _config_synced_gateway(cluster, tmp_path) as (config_url, gateway_url):
            urls = (cluster.url, cluster.probe_url, config_url, gateway_url)
            _assert_scrapes_expose(dashboard_series() - AFTER_RARE_EVENTS, urls)
    finally:
        httpx.delete(f"{cluster.url}/v1/pools/{WARM_POOL['name']}", timeout=10)
    assert dashboard_series() >= AFTER_RARE_EVENTS  # a name no dashboard reads any more leaves this list
