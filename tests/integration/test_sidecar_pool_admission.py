"""The sidecar's pool admission gate with real parts (seed 000 §16.3, seed 001 "Pool Admission"): sidecars on a
real nats-server, each serving the null backend, poll a stand-in for the gateway's `GET /v1/pools` over HTTP (the
seam under test). Work of a capped logical pool is NAKed by a worker the pool does not assign and redelivered (not
failed) until an assigned worker answers it; with the gateway unreachable the lane's own pool still flows and
logical pools fail closed; gateway errors keep the last good view, and a changed assignment reaches the sidecar
within one poll."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest

from launcher import NatsServer, free_port
from sie.catalog import Catalog
from sie.catalog.names import work_subject
from sie.settings import StreamSettings
from sie.settings.messaging import NatsSettings
from sie.sidecar import Sidecar, SidecarConfig
from sie.sidecar.pool_admission import GatewayPools, PoolGate, Refusal
from sie.transport.base import Lane
from sie.transport.nats import NatsTransport
from sie.wire.queue import WorkItem, WorkResult
from sie.worker.null_backend import NullWorkerService
from support.polling import eventually
from support.pools_gateway import PoolsGateway, pool_json

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
ROUTER = "gw-pools"
TOKEN = "inference-token"
ASSIGNED, UNASSIGNED = "w-assigned", "w-unassigned"
POLL_S = 0.1
WAIT_S = 15.0
STREAMS = StreamSettings(nak_delay_s=0.2, ack_wait_s=5.0, max_deliver=50)


@pytest.fixture
def lane() -> Lane:
    return Lane(pool=f"q{uuid.uuid4().hex[:10]}", machine_profile="l4", bundle="default")


def capped_pool(lane: Lane, worker_id: str) -> dict:
    """`acme`: a logical pool on the lane's queue pool, capped at one l4 worker, assigned `worker_id`."""
    return pool_json("acme", queue_pool=lane.pool, gpus={"l4": 1}, gpu_caps={"l4": 1}, assigned=[worker_id])


@pytest.fixture
def gateway(lane: Lane) -> Iterator[PoolsGateway]:
    """The stand-in gateway, listing `acme`: a logical pool on the lane's queue, capped, assigned to ASSIGNED."""
    stand_in = PoolsGateway()
    stand_in.put(capped_pool(lane, ASSIGNED))
    with stand_in.running():
        yield stand_in


class Gateway:
    """The publishing side: queues work items on the lane and collects the results on its inbox."""

    def __init__(self, transport: NatsTransport, lane: Lane) -> None:
        self.transport, self.lane = transport, lane
        self.results: dict[str, WorkResult] = {}

    async def publish(self, admission_pool: str | None) -> str:
        request_id = f"p-{uuid.uuid4().hex[:10]}"
        item = WorkItem(
            work_item_id=f"{request_id}.0", request_id=request_id, item_index=0, total_items=1, operation="encode",
            model_id=MODEL, profile_id="default", pool_name=self.lane.pool, machine_profile=self.lane.machine_profile,
            router_id=ROUTER, reply_subject=f"_INBOX.{ROUTER}.{request_id}", timestamp=time.time(),
            item={"text": "hello"}, admission_pool=admission_pool,
        )  # fmt: skip
        subject = work_subject(self.lane.pool, self.lane.machine_profile, self.lane.bundle, MODEL)
        await self.transport.publish_work(subject, item)
        return request_id

    async def answered(self, request_id: str) -> WorkResult:
        await eventually(lambda: request_id in self.results, timeout_s=WAIT_S, what=f"the result of {request_id}")
        return self.results[request_id]


@asynccontextmanager
async def publisher(server: NatsServer, lane: Lane) -> AsyncIterator[Gateway]:
    async with NatsTransport(NatsSettings(url=server.url), STREAMS) as transport:
        gateway = Gateway(transport, lane)

        async def collect(result: object) -> None:
            assert isinstance(result, WorkResult)
            gateway.results[result.request_id] = result

        subscription = await transport.subscribe_results(f"_INBOX.{ROUTER}.>", collect)
        try:
            yield gateway
        finally:
            await subscription.unsubscribe()


@asynccontextmanager
async def sidecar(
    server: NatsServer, lane: Lane, catalog: Catalog, worker_id: str, url: str
) -> AsyncIterator[PoolGate]:
    """A sidecar of `lane` for worker `worker_id` with the null backend, its gate polling `url`; yields the gate."""
    gate = PoolGate(GatewayPools(url, TOKEN, POLL_S), lane.pool, worker_id)
    config = SidecarConfig(stream=STREAMS, worker_id=worker_id, pool_gate=gate)
    async with AsyncExitStack() as stack:
        transport = await stack.enter_async_context(NatsTransport(NatsSettings(url=server.url), STREAMS))
        worker = NullWorkerService(catalog, worker_id, batch_budget=64)
        await stack.enter_async_context(Sidecar(transport, worker, lane, config))
        yield gate


async def test_an_unassigned_worker_gives_capped_work_back_until_an_assigned_one_serves_it(
    nats_server: NatsServer, lane: Lane, gateway: PoolsGateway, baseline_catalog: Catalog
) -> None:
    async with publisher(nats_server, lane) as gw:
        async with sidecar(nats_server, lane, baseline_catalog, UNASSIGNED, gateway.url) as gate:
            capped = await gw.publish("acme")
            own = await gw.publish(lane.pool)
            await eventually(lambda: gate.refused[("acme", Refusal.NOT_ASSIGNED)] >= 2, timeout_s=WAIT_S,
                             what="the unassigned worker to NAK the capped pool's item twice")  # fmt: skip
            assert (await gw.answered(own)).worker_id == UNASSIGNED  # its own queue pool is served as before
            assert capped not in gw.results
        assert ("GET", "/v1/pools", f"Bearer {TOKEN}") in gateway.requests

        async with sidecar(nats_server, lane, baseline_catalog, ASSIGNED, gateway.url) as gate:
            result = await gw.answered(capped)
            assert (result.success, result.worker_id) == (True, ASSIGNED)  # redelivered, not failed
            assert gate.refused == {}


async def test_the_lanes_own_pool_flows_while_the_gateway_is_unreachable(
    nats_server: NatsServer, lane: Lane, baseline_catalog: Catalog
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    async with (
        publisher(nats_server, lane) as gw,
        sidecar(nats_server, lane, baseline_catalog, ASSIGNED, nobody) as gate,
    ):
        unnamed, own, logical = await gw.publish(None), await gw.publish(lane.pool), await gw.publish("acme")
        assert (await gw.answered(unnamed)).success and (await gw.answered(own)).success
        await eventually(lambda: gate.refused[("acme", Refusal.NO_VIEW)] >= 1, timeout_s=WAIT_S,
                         what="the logical pool's item refused without a view")  # fmt: skip
        assert gate.pools is None and gate.failures >= 1
        assert logical not in gw.results


async def test_gateway_errors_keep_the_last_good_view_and_a_new_assignment_arrives_within_a_poll(
    nats_server: NatsServer, lane: Lane, gateway: PoolsGateway, baseline_catalog: Catalog
) -> None:
    async with (
        publisher(nats_server, lane) as gw,
        sidecar(nats_server, lane, baseline_catalog, ASSIGNED, gateway.url) as gate,
    ):
        assert gate.pools is not None and "acme" in gate.pools  # polled before the first fetch
        gateway.fail_with = 503
        failures = gate.failures
        await eventually(lambda: gate.failures > failures, timeout_s=WAIT_S, what="a failed poll")
        assert (await gw.answered(await gw.publish("acme"))).worker_id == ASSIGNED

        gateway.put(capped_pool(lane, UNASSIGNED))
        gateway.fail_with = None
        await eventually(lambda: gate.pools is not None and ASSIGNED not in gate.pools["acme"].assigned,
                         timeout_s=WAIT_S, what="the new assignment")  # fmt: skip
        moved = await gw.publish("acme")
        await eventually(lambda: gate.refused[("acme", Refusal.NOT_ASSIGNED)] >= 1, timeout_s=WAIT_S,
                         what="the item of a pool no longer assigned to this worker refused")  # fmt: skip

        gateway.remove("acme")
        await eventually(lambda: gate.pools is not None and "acme" not in gate.pools, timeout_s=WAIT_S,
                         what="the pool's deletion")  # fmt: skip
        await eventually(lambda: gate.refused[("acme", Refusal.UNKNOWN_POOL)] >= 1, timeout_s=WAIT_S,
                         what="the deleted pool's item refused (fail closed)")  # fmt: skip
        assert moved not in gw.results
