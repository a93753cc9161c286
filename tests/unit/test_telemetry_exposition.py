"""`/metrics` through its public surfaces: the plain handler merging worker children's series with `worker` and
`device` labels, the HTTP request middleware with bounded route and model labels, and the lane depth refresh."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from sie.gateway.lane_depth import LaneDepths
from sie.gateway.scaling import LaneSignals
from sie.pools import DemandTracker
from sie.telemetry.exposition import CONTENT_TYPE, ChildSource, MetricsEndpoint
from sie.telemetry.gateway import AdmissionDecision, GatewayMetrics, LaneDecision
from sie.telemetry.metrics import OTHER, ModelLabels, Telemetry
from sie.telemetry.requests import ObservedRequests, note_request
from sie.telemetry.worker import LoadOutcome, WorkerMetrics
from sie.transport.base import Lane, LaneDepth

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def child(name: str, device: str, loads: int) -> ChildSource:
    telemetry = Telemetry()
    metrics = WorkerMetrics(telemetry)
    for _ in range(loads):
        metrics.load_finished("m", LoadOutcome.LOADED, 0.5)

    async def fetch() -> str:
        return metrics.text()

    return ChildSource(name, device, fetch)


async def test_metrics_merges_children_with_worker_and_device_labels() -> None:
    own = Telemetry()
    own.set_applied_epoch(7)

    async def silent() -> str:
        await asyncio.sleep(60)
        return ""

    children = [child("worker-0", "cpu", 1), child("worker-1", "cuda:1", 2), ChildSource("worker-2", "cpu", silent)]
    reply = await MetricsEndpoint(own, lambda: children).handle("GET", "/metrics", {}, b"")
    assert reply is not None and reply.status == 200 and reply.content_type == CONTENT_TYPE
    text = reply.body.decode()
    found = parse(text)
    assert found[("sie_gateway_config_applied_epoch", frozenset())] == 7.0
    loads = "sie_worker_model_loads_total"
    base = {("model", "m"), ("outcome", "loaded")}
    assert found[(loads, frozenset(base | {("worker", "worker-0"), ("device", "cpu")}))] == 1.0
    assert found[(loads, frozenset(base | {("worker", "worker-1"), ("device", "cuda:1")}))] == 2.0
    assert not any(("worker", "worker-2") in labels for _, labels in found)  # it did not answer in time
    assert text.count("# TYPE sie_worker_model_loads_total counter") == 1
    assert text.count("# TYPE target_info") == 1


async def test_metrics_answers_only_its_path_and_get() -> None:
    endpoint = MetricsEndpoint(Telemetry())
    assert await endpoint.handle("GET", "/metricsx", {}, b"") is None
    refused = await endpoint.handle("POST", "/metrics", {}, b"")
    assert refused is not None and refused.status == 405


async def test_requests_are_counted_by_route_template_model_and_status() -> None:
    telemetry = Telemetry()
    metrics = GatewayMetrics(telemetry, ModelLabels(lambda model: model if model == "org/known" else None))

    async def encode(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def embeddings(request: Request) -> Response:
        note_request(model="org/known")
        return PlainTextResponse("no", status_code=503)

    routes = [Route("/v1/encode/{model:path}", encode, methods=["POST"]), Route("/v1/embeddings", embeddings)]
    app = Starlette(routes=routes, middleware=[Middleware(ObservedRequests, observers=[metrics.http.observe])])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gateway") as client:
        assert (await client.post("/v1/encode/org/known")).status_code == 200
        assert (await client.post("/v1/encode/org/unknown-1")).status_code == 200
        assert (await client.post("/v1/encode/org/unknown-2")).status_code == 200
        assert (await client.get("/v1/embeddings")).status_code == 503
        assert (await client.get("/no/such/path")).status_code == 404
    found = parse(telemetry.prometheus_text().decode())
    requests = "sie_gateway_requests_total"

    def labels(route: str, model: str, status: str) -> frozenset[tuple[str, str]]:
        return frozenset({("route", route), ("model", model), ("status", status)})

    assert found[(requests, labels("/v1/encode/{model:path}", "org/known", "200"))] == 1.0
    assert found[(requests, labels("/v1/encode/{model:path}", OTHER, "200"))] == 2.0
    assert found[(requests, labels("/v1/embeddings", "org/known", "503"))] == 1.0
    assert found[(requests, labels(OTHER, OTHER, "404"))] == 1.0
    durations = "sie_gateway_request_duration_seconds_count"
    assert found[(durations, labels("/v1/encode/{model:path}", OTHER, "200"))] == 2.0


async def test_lane_depths_refresh_and_keep_the_last_value_of_a_failed_read() -> None:
    telemetry = Telemetry()
    demand = DemandTracker(60.0)
    signals = LaneSignals(demand, lambda: {("gpu", "l4", "default"): 2}, lambda: [])
    GatewayMetrics(telemetry, ModelLabels(), signals)
    healthy, flaky = Lane("default", "l4", "default"), Lane("default", "a100", "big")
    answers = {healthy: [LaneDepth(3, 2), LaneDepth(0, 1)], flaky: [LaneDepth(5, 0), None]}

    async def read(lane: Lane) -> LaneDepth:
        answer = answers[lane].pop(0)
        if answer is None:
            raise TimeoutError("the broker did not answer")
        return answer

    depths = LaneDepths(read, lambda: [healthy, flaky], signals.set_depths)
    depth = "sie_gateway_lane_queue_depth"
    key = {("pool", "default"), ("machine_profile", "l4"), ("bundle", "default")}
    flaky_key = {("pool", "default"), ("machine_profile", "a100"), ("bundle", "big")}
    await depths.refresh()
    found = parse(telemetry.prometheus_text().decode())
    assert found[(depth, frozenset(key))] == 5.0
    assert found[("sie_gateway_lane_pending", frozenset(key))] == 3.0
    await depths.refresh()
    found = parse(telemetry.prometheus_text().decode())
    assert found[(depth, frozenset(key))] == 1.0
    assert found[(depth, frozenset(flaky_key))] == 5.0
    assert signals.lane(("default", "l4", "default")).queue_depth == 1  # what /v1/scaling/lanes reads


def test_pending_demand_and_warm_floors_are_lane_gauges() -> None:
    telemetry = Telemetry()
    demand = DemandTracker(60.0)
    signals = LaneSignals(demand, lambda: {("gpu", "l4", "default"): 2}, lambda: [])
    metrics = GatewayMetrics(telemetry, ModelLabels(), signals)
    demand.record(("gpu", "l4", "default"))
    demand.record(("gpu", "l4", "default"))
    metrics.lane_admission(("gpu", "l4", "default"), LaneDecision.SHED)
    found = parse(telemetry.prometheus_text().decode())
    lane = frozenset({("pool", "gpu"), ("machine_profile", "l4"), ("bundle", "default")})
    assert found[("sie_gateway_lane_pending_demand", lane)] == 2.0
    assert found[("sie_gateway_pool_warm_floor", lane)] == 2.0
    assert found[("sie_gateway_lane_admission_decisions_total", lane | {("decision", "shed")})] == 1.0
    demand.clear(("gpu", "l4", "default"))
    found = parse(telemetry.prometheus_text().decode())
    assert ("sie_gateway_lane_pending_demand", lane) not in found


@pytest.mark.parametrize("decision", ["admitted", "queue_full"])
async def test_admission_decisions_count(decision: str) -> None:
    telemetry = Telemetry()
    metrics = GatewayMetrics(telemetry, ModelLabels())
    metrics.admission(AdmissionDecision(decision))
    found = parse(telemetry.prometheus_text().decode())
    assert found[("sie_gateway_admission_decisions_total", frozenset({("decision", decision)}))] == 1.0


def test_result_chunk_reservations_and_rejections_are_reported() -> None:
    from sie.gateway.result_chunks import GLOBAL_BUDGET, ChunkBudget, ChunkTransferError

    telemetry = Telemetry()
    metrics = GatewayMetrics(telemetry, ModelLabels())
    budget = ChunkBudget(limit_bytes=1000)
    metrics.watch_result_chunks(budget)
    budget.reserve(600)
    with pytest.raises(ChunkTransferError):
        budget.reserve(600)
    found = parse(telemetry.prometheus_text().decode())
    assert found[("sie_gateway_result_chunks_reserved_bytes", frozenset())] == 600.0
    assert found[("sie_gateway_result_chunks_rejections_total", frozenset({("reason", GLOBAL_BUDGET)}))] == 1.0
    budget.release(600)
    assert parse(telemetry.prometheus_text().decode())[("sie_gateway_result_chunks_reserved_bytes", frozenset())] == 0
