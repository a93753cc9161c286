"""Worker direct-dispatch fallback with real parts (seed 000 §8.2, issue 33): the gateway's dispatcher, collector and
publisher on a real nats-server, and sidecars serving the null backend for `acme`, a capped logical pool whose workers
are assigned by a stand-in of the gateway's pools API. A capped pool's request goes to one assigned worker's own
stream; when that worker is down, the gateway publishes the items still unanswered after the fallback delay on the
lane, where another assigned worker answers them, and only once the lane stored them tells the first worker
(batch_cancel) to drop its copies. Each item is answered exactly once, through the fallback. A generation goes to one
eligible worker of the lane, or on the lane when that worker has no stream."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from launcher import NatsServer
from sie.catalog import Catalog
from sie.catalog.names import work_subject, work_worker_subject
from sie.gateway.collector import Collector
from sie.gateway.dispatch import DIRECT_FALLBACK_DELAY_S, Collected, Dispatcher
from sie.gateway.publisher import WorkPublisher
from sie.gateway.router import LaneHints, Route, Router
from sie.gateway.workitems import Ticket, encode_work, generate_work
from sie.settings import LaneSettings, StreamSettings
from sie.settings.messaging import NatsSettings
from sie.sidecar import Sidecar, SidecarConfig
from sie.sidecar.pool_admission import GatewayPools, PoolGate
from sie.transport.base import Lane
from sie.transport.nats import NatsTransport
from sie.wire import from_msgpack
from sie.wire.http import EncodeRequest, Item
from sie.wire.ipc_control import MODEL_STATE_LOADING_IN_PROGRESS, EnsureModelReadyRequest, EnsureModelReadyResponse
from sie.wire.queue import GenerateParams, WorkItem, WorkResult
from sie.worker.null_backend import NullWorkerService
from support.polling import eventually
from support.pools_gateway import PoolsGateway, pool_json

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
ROUTER = "gw-fallback"
TARGET, OTHER, UNASSIGNED = "w-target", "w-other", "w-unassigned"
ITEMS = 3
POLL_S = 0.1
WAIT_S = 15.0
STREAMS = StreamSettings(nak_delay_s=0.2, ack_wait_s=5.0, max_deliver=20, max_msgs=5000, max_age_s=900.0)


class Consumers:
    """The worker registry's answer: the lane is served and TARGET is its eligible worker (a registry still lists a
    worker that died for a few heartbeats), or `workers` when given."""

    def __init__(self, workers: list[str] | None = None) -> None:
        self.workers = workers

    async def has_consumer(
        self, lane: Lane, bundle_config_hash: str = "", workers: frozenset[str] | None = None
    ) -> bool:
        return True

    def eligible_workers(
        self, lane: Lane, bundle_config_hash: str = "", workers: frozenset[str] | None = None
    ) -> list[str]:
        return self.workers if self.workers is not None else [TARGET]


class Pools:
    """The gateway's pool directory for `acme`: capped, assigned TARGET and OTHER."""

    def assigned(self, name: str) -> frozenset[str]:
        return frozenset({TARGET, OTHER})


class LoadingWorker(NullWorkerService):
    """The null backend whose model stays loading until `loaded` is set: the sidecar holds its work meanwhile."""

    def __init__(self, catalog: Catalog, worker_id: str) -> None:
        super().__init__(catalog, worker_id, batch_budget=64)
        self.loaded = False

    async def ensure_model_ready(self, request: EnsureModelReadyRequest) -> EnsureModelReadyResponse:
        if not self.loaded:
            return EnsureModelReadyResponse(state=MODEL_STATE_LOADING_IN_PROGRESS)
        return await super().ensure_model_ready(request)


@attrs.define
class Gateway:
    """The gateway's dispatch core on its own NATS connection, plus what the test watches on the broker: every result
    on the gateway's inbox and every batch_cancel, in the order they and the lane's work items arrived."""

    transport: NatsTransport
    dispatcher: Dispatcher
    route: Route
    results: list[WorkResult] = attrs.Factory(list)
    events: list[str] = attrs.Factory(list)

    def collect(self, count: int) -> asyncio.Future[Collected]:
        request = EncodeRequest(items=[Item(text=f"text {n}") for n in range(count)])
        build = lambda ticket: encode_work(self.route, ticket, request, ["dense"])  # noqa: E731
        return asyncio.ensure_future(self.dispatcher.collect(self.route, build, None))


@pytest.fixture
def lane() -> Lane:
    return Lane(pool=f"x{uuid.uuid4().hex[:10]}", machine_profile="l4", bundle="default")


@pytest.fixture
def pools(lane: Lane) -> PoolsGateway:
    stand_in = PoolsGateway()
    stand_in.put(pool_json("acme", queue_pool=lane.pool, gpus={"l4": 2}, gpu_caps={"l4": 2}, assigned=[TARGET, OTHER]))
    return stand_in


def _nats(server: NatsServer) -> NatsTransport:
    return NatsTransport(NatsSettings(url=server.url), STREAMS)


@asynccontextmanager
async def gateway(
    server: NatsServer, client: Client, lane: Lane, catalog: Catalog, consumers: Consumers
) -> AsyncIterator[Gateway]:
    route = Router(lambda: catalog, LaneSettings()).route(MODEL, None, LaneHints())
    subject = work_subject(lane.pool, lane.machine_profile, lane.bundle, route.model_id)
    route = attrs.evolve(route, lane=lane, subject=subject, admission_pool="acme", bundle_config_hash="",
                         demand_lanes=())  # fmt: skip
    async with AsyncExitStack() as stack:
        transport = await stack.enter_async_context(_nats(server))
        collector = await stack.enter_async_context(Collector(transport, ROUTER))
        publisher = WorkPublisher(transport, consumers, ROUTER)
        router = Router(lambda: catalog, LaneSettings())
        dispatcher = Dispatcher(router, Pools(), publisher, collector, 30.0)  # type: ignore[arg-type]
        gw = Gateway(transport, dispatcher, route)

        async def on_result(result: object) -> None:
            assert isinstance(result, WorkResult)
            gw.results.append(result)

        async def on_lane_item(msg: Msg) -> None:
            gw.events.append(f"lane {from_msgpack(msg.data, WorkItem).item_index}")

        async def on_cancel(msg: Msg) -> None:
            gw.events.append(msg.subject)

        inbox = await transport.subscribe_results(f"_INBOX.{ROUTER}.>", on_result)
        stack.push_async_callback(inbox.unsubscribe)
        for watched, handler in ((subject, on_lane_item), ("batch_cancel.>", on_cancel)):
            subscription = await client.subscribe(watched, cb=handler)
            stack.push_async_callback(subscription.unsubscribe)
        await client.flush()
        yield gw


@asynccontextmanager
async def sidecar(
    server: NatsServer, lane: Lane, worker: NullWorkerService, pools: PoolsGateway
) -> AsyncIterator[Sidecar]:
    """A sidecar of `lane` for `worker`, gated by the pools stand-in, on its own NATS connection."""
    gate = PoolGate(GatewayPools(pools.url, None, POLL_S), lane.pool, worker.worker_id)
    config = SidecarConfig(stream=STREAMS, worker_id=worker.worker_id, pool_gate=gate)
    async with AsyncExitStack() as stack:
        transport = await stack.enter_async_context(_nats(server))
        yield await stack.enter_async_context(Sidecar(transport, worker, lane, config))


async def stream_holds(client: Client, worker_id: str, count: int) -> bool:
    """Whether the worker's direct-dispatch stream holds `count` messages now."""
    return (await client.jsm().stream_info(f"WORK_WORKER_{worker_id}")).state.messages == count


def null(catalog: Catalog, worker_id: str) -> NullWorkerService:
    return NullWorkerService(catalog, worker_id, batch_budget=64)


async def test_a_target_stopped_after_the_publish_is_replaced_by_the_lane_and_drops_its_copies_once_back(
    nats_server: NatsServer, nats_client: Client, lane: Lane, pools: PoolsGateway, baseline_catalog: Catalog
) -> None:
    with pools.running():
        async with (
            gateway(nats_server, nats_client, lane, baseline_catalog, Consumers()) as gw,
            sidecar(nats_server, lane, null(baseline_catalog, OTHER), pools) as other,
        ):
            async with sidecar(nats_server, lane, null(baseline_catalog, TARGET), pools):
                pass  # the target's stream and durable consumer exist; nobody reads them now
            started = time.monotonic()
            request = gw.collect(ITEMS)
            await eventually(lambda: stream_holds(nats_client, TARGET, ITEMS), what="the direct items on its stream")

            # The target comes back before the fallback delay ends; its model loads, so it holds its direct items.
            loading = LoadingWorker(baseline_catalog, TARGET)
            async with sidecar(nats_server, lane, loading, pools) as target:
                assert time.monotonic() - started < DIRECT_FALLBACK_DELAY_S  # so it hears the batch_cancel
                await eventually(lambda: target.pending >= ITEMS, what="the target holding its direct items")
                # The lane stored the unanswered items, then the target was told: it drops them without running them.
                await eventually(lambda: target.abandoned.get("fallen_back") == ITEMS, timeout_s=WAIT_S,
                                 what="the target dropping its direct items")  # fmt: skip
                assert time.monotonic() - started >= DIRECT_FALLBACK_DELAY_S
                loading.loaded = True  # lane copies it may hold now run here; its direct ones are gone
                collected = await asyncio.wait_for(request, WAIT_S)
                await eventually(lambda: target.pending == 0 and other.pending == 0, what="every worker idle")
                # Its acks reach the server after it settled them: the stream empties once the server has them.
                await eventually(lambda: stream_holds(nats_client, TARGET, 0), what="the target's stream emptied")

    request_id = collected.meta.request_id
    answers = [result for result in gw.results if result.request_id == request_id]
    assert sorted(result.item_index for result in answers) == list(range(ITEMS))  # exactly one answer per item
    assert all(result.success and not result.direct_origin for result in answers)  # all through the fallback
    assert all(result.success and not result.direct_origin for result in collected.results)
    cancel = f"batch_cancel.{ROUTER}.{TARGET}.{request_id}"
    assert gw.events.count(cancel) == 1
    assert sorted(gw.events[: gw.events.index(cancel)]) == [f"lane {n}" for n in range(ITEMS)]  # after the lane


async def test_a_target_that_stays_down_costs_the_fallback_delay_and_the_unassigned_worker_never_answers(
    nats_server: NatsServer, nats_client: Client, lane: Lane, pools: PoolsGateway, baseline_catalog: Catalog
) -> None:
    with pools.running():
        async with (
            gateway(nats_server, nats_client, lane, baseline_catalog, Consumers()) as gw,
            sidecar(nats_server, lane, null(baseline_catalog, OTHER), pools),
            sidecar(nats_server, lane, null(baseline_catalog, UNASSIGNED), pools),
        ):
            async with sidecar(nats_server, lane, null(baseline_catalog, TARGET), pools):
                pass
            started = time.monotonic()
            collected = await asyncio.wait_for(gw.collect(ITEMS), WAIT_S)
            assert time.monotonic() - started >= DIRECT_FALLBACK_DELAY_S
            assert {result.worker_id for result in collected.results} == {OTHER}
            assert await stream_holds(nats_client, TARGET, ITEMS)  # never read, so nobody dropped them
            assert len(gw.dispatcher.collector) == 0
            request_id = collected.meta.request_id
            await eventually(lambda: f"batch_cancel.{ROUTER}.{TARGET}.{request_id}" in gw.events, what="the cancel")
            answers = [result for result in gw.results if result.request_id == request_id]
            assert sorted(result.item_index for result in answers) == list(range(ITEMS))


async def test_a_generation_goes_to_one_eligible_worker_or_on_the_lane_when_its_stream_is_absent(
    nats_server: NatsServer, nats_client: Client, lane: Lane, baseline_catalog: Catalog
) -> None:
    workers = ["w-gen-1", "w-gen-2"]
    consumers = Consumers(workers)
    async with (
        gateway(nats_server, nats_client, lane, baseline_catalog, consumers) as gw,
        _nats(nats_server) as worker_side,
    ):
        route = attrs.evolve(gw.route, admission_pool=None)  # any eligible worker of the lane, not a capped pool's
        direct = {worker: await worker_side.worker_consumer(lane, worker) for worker in workers}
        on_lane = await worker_side.consumer(lane)

        def build(ticket: Ticket) -> WorkItem:
            return generate_work(route, ticket, GenerateParams(prompt="Hello"))

        streamed = await gw.dispatcher.stream(route, build, None)
        fetched = {worker: await consumer.fetch(1, 1.0) for worker, consumer in direct.items()}
        (chosen,) = [worker for worker, deliveries in fetched.items() if deliveries]
        (delivery,) = fetched[chosen]
        assert delivery.item.request_id == streamed.request_id
        assert delivery.subject == work_worker_subject(lane.pool, "l4", "default", route.model_id, chosen)
        assert await on_lane.fetch(1, 0.2) == []
        await delivery.ack()
        streamed.close()

        consumers.workers = ["w-gen-gone"]  # heard of, but without a direct-dispatch stream
        streamed = await gw.dispatcher.stream(route, build, None)
        (delivery,) = await on_lane.fetch(1, WAIT_S)
        assert (delivery.item.request_id, delivery.subject) == (streamed.request_id, route.subject)
        await delivery.ack()
        streamed.close()
