"""Worker direct-dispatch with real parts (seed 000 §8.2 "Worker direct-dispatch", §16.3 capped logical pools):
sidecars on a real nats-server, each serving the null backend, bind their worker's own stream `WORK_WORKER_{worker}`
(durable `gen-{worker}`) beside their lane consumer. Work published on a worker's subject is answered by that worker
only, while lane work flows through the same sidecar; an unassigned sidecar of the lane never sees (nor NAKs) a
capped pool's direct work. A publish for a worker without a stream raises NoConsumerError and creates nothing; the
worker stream is created with the pool streams' settings, reconciled when it exists, and outlives a sidecar restart
(same durable consumer, queued work kept); work that dies on it still lands in DEAD_LETTERS."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager

import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js import api

from launcher import NatsServer
from sie.catalog import Catalog
from sie.catalog.names import work_subject, work_worker_subject
from sie.gateway.dead_letters import DeadLetterQueue
from sie.settings import StreamSettings
from sie.settings.messaging import NatsSettings
from sie.sidecar import Sidecar, SidecarConfig
from sie.sidecar.pool_admission import GatewayPools, PoolGate
from sie.transport.base import Lane, NoConsumerError
from sie.transport.nats import NatsTransport
from sie.wire.queue import WorkItem, WorkResult
from sie.worker.null_backend import NullWorkerService
from support.polling import eventually
from support.pools_gateway import PoolsGateway, pool_json

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_TOKEN = "sentence-transformers__all-MiniLM-L6-v2"
ROUTER = "gw-direct"
ASSIGNED, UNASSIGNED = "w-assigned", "w-unassigned"
POLL_S = 0.1
WAIT_S = 15.0
STREAMS = StreamSettings(nak_delay_s=0.2, ack_wait_s=5.0, max_deliver=20, max_msgs=5000, max_age_s=900.0)


@pytest.fixture
def lane() -> Lane:
    return Lane(pool=f"x{uuid.uuid4().hex[:10]}", machine_profile="l4", bundle="default")


@pytest.fixture
def worker_id() -> str:
    return f"w-{uuid.uuid4().hex[:8]}"


def make_item(lane: Lane, admission_pool: str | None = None) -> WorkItem:
    request_id = f"d-{uuid.uuid4().hex[:10]}"
    return WorkItem(
        work_item_id=f"{request_id}.0", request_id=request_id, item_index=0, total_items=1, operation="encode",
        model_id=MODEL, profile_id="default", pool_name=lane.pool, machine_profile=lane.machine_profile,
        router_id=ROUTER, reply_subject=f"_INBOX.{ROUTER}.{request_id}", timestamp=time.time(),
        item={"text": "hello"}, admission_pool=admission_pool,
    )  # fmt: skip


def lane_subject(lane: Lane) -> str:
    return work_subject(lane.pool, lane.machine_profile, lane.bundle, MODEL)


def direct_subject(lane: Lane, worker_id: str) -> str:
    return work_worker_subject(lane.pool, lane.machine_profile, lane.bundle, MODEL, worker_id)


def _nats(server: NatsServer, settings: StreamSettings = STREAMS) -> NatsTransport:
    return NatsTransport(NatsSettings(url=server.url), settings)


class Publisher:
    """The gateway's side: publishes work items and collects the results on its inbox."""

    def __init__(self, transport: NatsTransport) -> None:
        self.transport = transport
        self.results: dict[str, WorkResult] = {}

    async def publish(self, subject: str, item: WorkItem) -> str:
        await self.transport.publish_work(subject, item)
        return item.request_id

    async def answered(self, request_id: str) -> WorkResult:
        await eventually(lambda: request_id in self.results, timeout_s=WAIT_S, what=f"the result of {request_id}")
        return self.results[request_id]


@asynccontextmanager
async def publisher(server: NatsServer) -> AsyncIterator[Publisher]:
    async with _nats(server) as transport:
        gateway = Publisher(transport)

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
    server: NatsServer, lane: Lane, catalog: Catalog, worker_id: str, gate: PoolGate | None = None
) -> AsyncIterator[Sidecar]:
    """A sidecar of `lane` for worker `worker_id` with the null backend, on its own NATS connection."""
    config = SidecarConfig(stream=STREAMS, worker_id=worker_id, pool_gate=gate)
    async with AsyncExitStack() as stack:
        transport = await stack.enter_async_context(_nats(server))
        worker = NullWorkerService(catalog, worker_id, batch_budget=64)
        yield await stack.enter_async_context(Sidecar(transport, worker, lane, config))


@pytest.fixture
def pools(lane: Lane) -> Iterator[PoolsGateway]:
    """A stand-in for the gateway's `GET /v1/pools`: `acme`, a logical pool on the lane's queue pool, capped at one
    l4 worker and assigned ASSIGNED."""
    stand_in = PoolsGateway()
    stand_in.put(pool_json("acme", queue_pool=lane.pool, gpus={"l4": 1}, gpu_caps={"l4": 1}, assigned=[ASSIGNED]))
    with stand_in.running():
        yield stand_in


async def test_direct_work_and_lane_work_flow_through_one_sidecar_at_once(
    nats_server: NatsServer, lane: Lane, worker_id: str, baseline_catalog: Catalog
) -> None:
    async with publisher(nats_server) as gw, sidecar(nats_server, lane, baseline_catalog, worker_id) as serving:
        assert serving.direct_dispatch
        direct = [make_item(lane) for _ in range(8)]
        on_lane = [make_item(lane) for _ in range(8)]
        published = await asyncio.gather(
            *(gw.publish(direct_subject(lane, worker_id), item) for item in direct),
            *(gw.publish(lane_subject(lane), item) for item in on_lane),
        )
        results = [await gw.answered(request_id) for request_id in published]
        assert all(result.success and result.worker_id == worker_id for result in results)
        assert len({result.request_id for result in results}) == len(direct) + len(on_lane)


async def test_a_capped_pools_direct_work_never_reaches_an_unassigned_worker_of_the_lane(
    nats_server: NatsServer, lane: Lane, pools: PoolsGateway, baseline_catalog: Catalog
) -> None:
    def gate(worker_id: str) -> PoolGate:
        return PoolGate(GatewayPools(pools.url, None, POLL_S), lane.pool, worker_id)

    unassigned_gate = gate(UNASSIGNED)
    async with (
        publisher(nats_server) as gw,
        sidecar(nats_server, lane, baseline_catalog, ASSIGNED, gate(ASSIGNED)),
        sidecar(nats_server, lane, baseline_catalog, UNASSIGNED, unassigned_gate),
    ):
        capped = [make_item(lane, "acme") for _ in range(8)]
        on_lane = [make_item(lane) for _ in range(8)]
        published = await asyncio.gather(
            *(gw.publish(direct_subject(lane, ASSIGNED), item) for item in capped),
            *(gw.publish(lane_subject(lane), item) for item in on_lane),
        )
        results = {request_id: await gw.answered(request_id) for request_id in published}

        assert all(result.success for result in results.values())
        assert {results[item.request_id].worker_id for item in capped} == {ASSIGNED}  # admitted by its pool gate
        assert {results[item.request_id].worker_id for item in on_lane} <= {ASSIGNED, UNASSIGNED}
        assert unassigned_gate.polls >= 1 and unassigned_gate.refused == {}  # never saw, so never NAKed, capped work


async def test_a_publish_for_a_worker_without_a_stream_raises_no_consumer_and_creates_nothing(
    nats_server: NatsServer, nats_client: Client, lane: Lane, worker_id: str
) -> None:
    subject = direct_subject(lane, worker_id)
    async with _nats(nats_server) as gateway:
        with pytest.raises(NoConsumerError):
            await gateway.publish_work(subject, make_item(lane))
    async with _nats(nats_server) as gateway:  # a fresh connection, which has not met the worker yet
        stored = await gateway.submit_work_batch(subject, [make_item(lane), make_item(lane)])
        with pytest.raises(NoConsumerError):
            await stored
        with pytest.raises(NoConsumerError):  # now known to have none: refused while sending
            await gateway.submit_work_batch(subject, [make_item(lane)])
        assert await gateway.pending(lane.pool) == 0
    jsm = nats_client.jsm()
    for stream in (f"WORK_WORKER_{worker_id}", f"WORK_POOL_{lane.pool}"):
        with pytest.raises(nats.js.errors.NotFoundError):
            await jsm.stream_info(stream)


async def test_the_worker_stream_is_reconciled_and_outlives_a_sidecar_restart(
    nats_server: NatsServer, nats_client: Client, lane: Lane, worker_id: str, baseline_catalog: Catalog
) -> None:
    stream, consumer = f"WORK_WORKER_{worker_id}", f"gen-{worker_id}"
    wanted_subject = f"sie.work.{lane.pool}.l4.default.*.{worker_id}"
    jsm = nats_client.jsm()
    # Left by an older release: another subject, another max_age and discard policy.
    await jsm.add_stream(
        name=stream, subjects=[f"sie.work.{lane.pool}.l4.other.*.{worker_id}"], storage=api.StorageType.MEMORY,
        retention=api.RetentionPolicy.WORK_QUEUE, max_age=60.0, max_msgs=5000, discard=api.DiscardPolicy.OLD,
    )  # fmt: skip

    async with publisher(nats_server) as gw:
        async with sidecar(nats_server, lane, baseline_catalog, worker_id):
            info = await jsm.stream_info(stream)
            assert info.config.subjects == [wanted_subject]
            assert (info.config.retention, info.config.storage, info.config.discard) == ("workqueue", "memory", "new")
            assert (info.config.max_age, info.config.max_msgs, info.config.num_replicas) == (900.0, 5000, 1)
            durable = await jsm.consumer_info(stream, consumer)
            assert durable.config.durable_name == consumer
            assert durable.config.filter_subject == wanted_subject
            assert durable.config.ack_policy == "explicit"
            assert (durable.config.ack_wait, durable.config.max_deliver) == (5.0, 20)
            assert (await gw.answered(await gw.publish(direct_subject(lane, worker_id), make_item(lane)))).success

        # Another process ensuring the same worker stream changes nothing.
        async with _nats(nats_server) as other:
            await other.worker_consumer(lane, worker_id)
            assert await other.worker_consumer(lane, worker_id) is await other.worker_consumer(lane, worker_id)
        assert (await jsm.consumer_info(stream, consumer)).created == durable.created

        # With no sidecar, direct work waits in the stream; the restarted sidecar's same durable consumer takes it.
        waiting = await gw.publish(direct_subject(lane, worker_id), make_item(lane))
        assert (await jsm.stream_info(stream)).state.messages == 1
        async with sidecar(nats_server, lane, baseline_catalog, worker_id):
            result = await gw.answered(waiting)
            assert (result.success, result.worker_id) == (True, worker_id)
        after = await jsm.consumer_info(stream, consumer)
        assert after.created == durable.created
        assert after.delivered.stream_seq > durable.delivered.stream_seq


async def test_work_that_dies_on_a_worker_stream_lands_in_the_dead_letters(
    nats_server: NatsServer, nats_client: Client, lane: Lane, worker_id: str
) -> None:
    settings = StreamSettings(ack_wait_s=5.0, max_deliver=2)
    async with (
        _nats(nats_server, settings) as worker_side,
        _nats(nats_server, settings) as gateway,
        DeadLetterQueue(gateway, 30.0) as queue,
    ):
        direct = await worker_side.worker_consumer(lane, worker_id)
        item = make_item(lane)
        await gateway.publish_work(direct_subject(lane, worker_id), item)
        for attempt in (1, 2):
            (delivery,) = await direct.fetch(1, WAIT_S)
            assert (delivery.num_delivered, delivery.subject) == (attempt, direct_subject(lane, worker_id))
            await delivery.nak()

        async def captured() -> bool:
            assert await direct.fetch(1, 0.1) == []  # JetStream advises once a pull request finds the item spent
            return queue.captured >= 1

        await eventually(captured, timeout_s=WAIT_S, interval_s=0, what="the dead letter of the worker stream")
        letters = [letter for letter in await gateway.dead_letters().letters(0, 1000) if letter.item is not None]
        (letter,) = [letter for letter in letters if letter.item.request_id == item.request_id]
        assert (letter.subject, letter.stream) == (direct_subject(lane, worker_id), f"WORK_WORKER_{worker_id}")
        assert (letter.consumer, letter.deliveries) == (f"gen-{worker_id}", 2)
        stored = await nats_client.jsm().get_msg("DEAD_LETTERS", letter.letter_id)
        assert stored.subject == f"sie.dlq.{MODEL_TOKEN}"  # the model token, not the worker one
