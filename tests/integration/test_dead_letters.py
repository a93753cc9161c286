"""The dead-letter queue (seed 000 §8, issue 13 §3) with real parts: work NAKed until max_deliver on a real
nats-server is advised by JetStream, moved into DEAD_LETTERS exactly once by two gateway replicas and removed
from its work stream; operators list, show, replay, delete and purge it over the gateway's `/v1/dlq` routes.
A gateway started while NATS is down captures once it connects. In the `all` wiring (loopback transport, the
real sidecar), poison work the sidecar's hash gate NAKs to death ends up in the in-memory dead letters, and a
replay re-drives it through the sidecar."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette

from launcher import NatsServer, free_port
from sie.catalog import Catalog
from sie.catalog.names import work_subject
from sie.gateway.dead_letters import DeadLetterQueue
from sie.gateway.http.app import GatewaySources, build_gateway_app
from sie.gateway.http.auth import GatewayAuth
from sie.gateway.publisher import QueueConsumers
from sie.settings import BatchingSettings, GatewaySettings, LaneSettings, StreamSettings
from sie.settings.messaging import NatsSettings
from sie.sidecar import Sidecar, SidecarConfig
from sie.telemetry.gateway import StoreMetrics
from sie.telemetry.metrics import Telemetry
from sie.transport.base import Lane, LaneConsumer, Transport
from sie.transport.loopback import LoopbackTransport
from sie.transport.nats import NatsTransport
from sie.transport.reconnecting import ReconnectingTransport
from sie.wire.queue import WorkItem
from sie.worker.manager import ModelManager
from sie.worker.runner import BatchRunner
from sie.worker.service import WorkerService
from support.gateway_fakes import NoWorkers
from support.polling import eventually
from support.prometheus import counts_by

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
MAX_DELIVER = 3
REPLAY_TIMEOUT_S = 30.0
LONG_WAIT_S = 10.0
ADMIN_TOKEN = "s3cret"
_ids = itertools.count()


def make_item(lane: Lane, bundle_config_hash: str | None = None) -> WorkItem:
    request_id = f"dlq-{uuid.uuid4().hex[:8]}-{next(_ids)}"
    return WorkItem(
        work_item_id=f"{request_id}.0", request_id=request_id, item_index=0, total_items=1, operation="encode",
        model_id=MODEL, profile_id="default", pool_name=lane.pool, machine_profile=lane.machine_profile,
        router_id="gw-test", reply_subject=f"_INBOX.gw-test.{request_id}", timestamp=time.time(),
        item={"text": "poison"}, bundle_config_hash=bundle_config_hash,
    )  # fmt: skip


def subject_of(lane: Lane) -> str:
    return work_subject(lane.pool, lane.machine_profile, lane.bundle, MODEL)


@asynccontextmanager
async def gateway_http(
    catalog: Catalog, transport: Transport, queue: DeadLetterQueue, admin_token: str | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway app over `transport` with its dead letters, driven in process over HTTP."""
    auth = GatewayAuth(admin_token=admin_token)
    sources = GatewaySources(
        lambda: catalog, transport, QueueConsumers(transport), NoWorkers(), dead_letters=queue, auth=auth
    )
    app: Starlette = build_gateway_app(sources, GatewaySettings(), LaneSettings(), "gw-test")
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client,
    ):
        yield client


async def nak_until_dead(consumer: LaneConsumer, *queues: DeadLetterQueue, first: int = 1) -> None:
    """NAK the one queued item on every delivery from delivery `first` on, then pull until a queue has handled
    the advisory (JetStream advises once a pull request finds the item spent)."""
    for attempt in range(first, MAX_DELIVER + 1):
        (delivery,) = await consumer.fetch(1, LONG_WAIT_S)
        assert delivery.num_delivered == attempt
        await delivery.nak()
    handled = sum(queue.advisories for queue in queues)

    async def advised() -> bool:
        assert await consumer.fetch(1, 0.1) == []
        return sum(queue.advisories for queue in queues) > handled

    await eventually(advised, timeout_s=LONG_WAIT_S, interval_s=0, what="the max-deliveries advisory")


async def letter_of(client: httpx.AsyncClient, request_id: str) -> dict | None:
    listed = await client.get("/v1/dlq", params={"limit": 1000})
    assert listed.status_code == 200, listed.text
    found = [letter for letter in listed.json()["dead_letters"] if letter["request_id"] == request_id]
    assert len(found) <= 1, found
    return found[0] if found else None


@pytest.fixture
def lane() -> Lane:
    return Lane(pool=f"d{uuid.uuid4().hex[:10]}", machine_profile="l4", bundle="default")


def _nats(server: NatsServer) -> NatsTransport:
    return NatsTransport(NatsSettings(url=server.url), StreamSettings(max_deliver=MAX_DELIVER, ack_wait_s=5.0))


async def test_two_gateways_keep_dead_work_once_and_operators_replay_and_purge_it(
    nats_server: NatsServer, lane: Lane, baseline_catalog: Catalog
) -> None:
    telemetry_a, telemetry_b = Telemetry(), Telemetry()
    async with (
        _nats(nats_server) as sidecar,
        _nats(nats_server) as gateway_a,
        _nats(nats_server) as gateway_b,
        DeadLetterQueue(gateway_a, REPLAY_TIMEOUT_S, metrics=StoreMetrics(telemetry_a)) as queue_a,
        DeadLetterQueue(gateway_b, REPLAY_TIMEOUT_S, metrics=StoreMetrics(telemetry_b)) as queue_b,
        gateway_http(baseline_catalog, gateway_a, queue_a) as client,
    ):
        consumer = await sidecar.consumer(lane)
        item = make_item(lane)
        await sidecar.publish_work(subject_of(lane), item)
        await nak_until_dead(consumer, queue_a)
        await eventually(lambda: queue_a.advisories >= 1 and queue_b.advisories >= 1, what="both replicas")

        assert queue_a.captured + queue_b.captured == 1
        assert await sidecar.pending(lane.pool) == 0  # gone from the work stream
        letter = await letter_of(client, item.request_id)
        assert letter is not None
        assert (letter["model"], letter["operation"], letter["deliveries"]) == (MODEL, "encode", MAX_DELIVER)
        assert letter["subject"] == subject_of(lane)
        assert letter["dead_letter_subject"] == "sie.dlq.sentence-transformers__all-MiniLM-L6-v2"
        assert letter["stream"] == f"WORK_POOL_{lane.pool}" and letter["replayable"]

        shown = await client.get(f"/v1/dlq/{letter['id']}")
        assert shown.status_code == 200
        assert shown.json()["item"]["item"] == {"text": "poison"}

        replayed = await client.post(f"/v1/dlq/{letter['id']}/replay")
        assert replayed.status_code == 200, replayed.text
        assert replayed.json()["request_id"] == f"{item.request_id}-dlq{letter['id']}"
        assert (await client.get(f"/v1/dlq/{letter['id']}")).status_code == 404
        # The replay is queued on the original lane with a fresh deadline; NAKed to death again, it is a new letter.
        (again,) = await consumer.fetch(1, LONG_WAIT_S)
        assert again.item.request_id == replayed.json()["request_id"]
        assert again.item.item == item.item and again.item.deadline > time.time()
        await again.nak()
        await nak_until_dead(consumer, queue_a, queue_b, first=2)
        await eventually(lambda: queue_a.advisories == queue_b.advisories == 2, what="both replicas")
        assert await letter_of(client, again.item.request_id) is not None

        missing = await client.delete("/v1/dlq/999999999")
        assert (missing.status_code, missing.json()["detail"]["code"]) == (404, "NOT_FOUND")
        purged = await client.post("/v1/dlq/purge")
        assert purged.status_code == 200 and purged.json()["purged"] >= 1
        assert (await client.get("/v1/dlq")).json() == {"dead_letters": [], "next_after": None}
        # the operator's verbs ran on gateway a; the captures were shared by the two replicas
        events_a, events_b = dead_letter_events(telemetry_a), dead_letter_events(telemetry_b)
        assert events_a.get("captured", 0) + events_b.get("captured", 0) == 2
        assert events_a["replayed"] == 1 and events_a["purged"] == purged.json()["purged"]


def dead_letter_events(telemetry: Telemetry) -> dict[str, float]:
    """`sie_gateway_dead_letters_total` by event, as a scrape shows it."""
    return counts_by(telemetry, "sie_gateway_dead_letters_total", "event")


async def test_with_an_admin_token_the_dead_letters_need_it(nats_server: NatsServer, baseline_catalog: Catalog) -> None:
    async with (
        _nats(nats_server) as gateway,
        DeadLetterQueue(gateway, REPLAY_TIMEOUT_S) as queue,
        gateway_http(baseline_catalog, gateway, queue, ADMIN_TOKEN) as client,
    ):
        missing = await client.get("/v1/dlq")
        assert (missing.status_code, missing.json()["detail"]["code"]) == (401, "UNAUTHORIZED")
        wrong = await client.post("/v1/dlq/purge", headers={"Authorization": "Bearer nope"})
        assert (wrong.status_code, wrong.json()["detail"]["code"]) == (403, "FORBIDDEN")
        allowed = await client.get("/v1/dlq", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert allowed.status_code == 200
        assert (await client.get("/v1/dlq?limit=0", headers={"Authorization": ADMIN_TOKEN})).status_code == 400


async def test_a_queue_entered_before_its_transport_subscribes_once_the_transport_is_up(
    nats_server: NatsServer, lane: Lane
) -> None:
    gateway = _nats(nats_server)
    async with DeadLetterQueue(gateway, REPLAY_TIMEOUT_S) as queue:  # not entered yet: subscribing is refused
        assert not queue.subscribed
        async with gateway, _nats(nats_server) as sidecar:
            await eventually(lambda: queue.subscribed, timeout_s=LONG_WAIT_S, what="the advisory subscription")
            await sidecar.publish_work(subject_of(lane), make_item(lane))
            await nak_until_dead(await sidecar.consumer(lane), queue)
            assert queue.captured == 1
            assert await sidecar.pending(lane.pool) == 0


async def test_a_gateway_started_while_nats_is_down_captures_once_it_connects(tmp_path: Path, lane: Lane) -> None:
    # The gateway role's wiring: a ReconnectingTransport connecting in the background, the queue entered at once.
    port = free_port()
    settings = StreamSettings(max_deliver=MAX_DELIVER, ack_wait_s=5.0)
    url = NatsSettings(url=f"nats://127.0.0.1:{port}")
    reconnecting = ReconnectingTransport(lambda: NatsTransport(url, settings), initial_backoff_s=0.05)
    async with reconnecting as gateway, DeadLetterQueue(gateway, REPLAY_TIMEOUT_S) as queue:
        assert queue.subscribed and gateway.unavailable_reason() is not None
        server = NatsServer(tmp_path, port)
        try:
            await eventually(lambda: gateway.unavailable_reason() is None, timeout_s=LONG_WAIT_S, what="the connection")
            async with NatsTransport(url, settings) as sidecar:
                await sidecar.publish_work(subject_of(lane), make_item(lane))
                await nak_until_dead(await sidecar.consumer(lane), queue)
                assert queue.captured == 1
                assert await sidecar.pending(lane.pool) == 0
        finally:
            server.stop()


async def test_in_the_all_wiring_the_sidecar_naks_poison_work_into_the_dead_letters(
    baseline_catalog: Catalog, load_model
) -> None:
    lane = Lane("default", "default", "default")
    stream = StreamSettings(max_deliver=MAX_DELIVER, nak_delay_s=0.01)
    async with ModelManager(baseline_catalog, lambda model, profile, model_id: load_model(model_id)) as manager:
        service = WorkerService(manager, BatchRunner(manager), "w-1", LaneSettings(), BatchingSettings())
        async with (
            LoopbackTransport(stream) as transport,
            DeadLetterQueue(transport, REPLAY_TIMEOUT_S) as queue,
            Sidecar(transport, service, lane, SidecarConfig(stream=stream)),
            gateway_http(baseline_catalog, transport, queue) as client,
        ):
            # Queued for another config than the worker's: the hash gate NAKs it on every delivery (seed 001).
            poison = make_item(lane, bundle_config_hash="0" * 64)
            await transport.publish_work(subject_of(lane), poison)
            await eventually(lambda: queue.captured == 1, timeout_s=LONG_WAIT_S, what="the dead letter")
            assert await transport.pending(lane.pool) == 0
            letter = await letter_of(client, poison.request_id)
            assert letter is not None and letter["deliveries"] == MAX_DELIVER

            replayed = await client.post(f"/v1/dlq/{letter['id']}/replay")
            assert replayed.status_code == 200, replayed.text
            # Still poison: the sidecar NAKs the replay to death too, so it comes back as a letter of its own.
            await eventually(lambda: queue.captured == 2, timeout_s=LONG_WAIT_S, what="the replay's dead letter")
            assert await letter_of(client, poison.request_id) is None
            assert await letter_of(client, replayed.json()["request_id"]) is not None
            assert (await client.post("/v1/dlq/purge")).json() == {"purged": 1}


async def spend_unheard(consumer: LaneConsumer) -> None:
    """NAK the one queued item on every delivery while no gateway listens, then pull once more so JetStream sends
    its advisory (to nobody)."""
    for _ in range(MAX_DELIVER):
        (delivery,) = await consumer.fetch(1, LONG_WAIT_S)
        await delivery.nak()
    assert await consumer.fetch(1, 0.5) == []


async def test_work_spent_while_no_gateway_ran_is_swept_into_the_dead_letters_when_one_starts(
    nats_server: NatsServer, lane: Lane, baseline_catalog: Catalog
) -> None:
    # The session's nats-server holds other tests' work too: every check here is about this test's own lane.
    async with _nats(nats_server) as sidecar, _nats(nats_server) as gateway:
        consumer = await sidecar.consumer(lane)
        spent, busy = make_item(lane), make_item(lane)
        await sidecar.publish_work(subject_of(lane), spent)
        await spend_unheard(consumer)

        async def letters_of_this_lane(queue: DeadLetterQueue) -> list[str]:
            letters = await queue.letters(limit=1000)
            return [letter.item.request_id for letter in letters if letter.item and letter.item.pool_name == lane.pool]

        # A lane with work in flight is left alone (a message waiting for its redelivery looks the same).
        await sidecar.publish_work(subject_of(lane), busy)
        (held,) = await consumer.fetch(1, LONG_WAIT_S)
        async with DeadLetterQueue(gateway, REPLAY_TIMEOUT_S, sweep_min_age_s=0.0) as early:
            await early.sweep()
            assert await letters_of_this_lane(early) == []
        await held.ack()
        await sidecar.flush()  # the ACK reached the broker: nothing is in flight on the lane now

        # Young work is left to the advisory on its way; old enough, it is captured as the advisory would have.
        async with DeadLetterQueue(gateway, REPLAY_TIMEOUT_S, sweep_min_age_s=3600.0) as young:
            await young.sweep()
            assert await letters_of_this_lane(young) == []
        async with (
            DeadLetterQueue(gateway, REPLAY_TIMEOUT_S, sweep_interval_s=60.0, sweep_min_age_s=0.0) as queue,
            gateway_http(baseline_catalog, gateway, queue) as client,
        ):
            await eventually(lambda: letter_of(client, spent.request_id), timeout_s=LONG_WAIT_S, what="the sweep")
            letter = await letter_of(client, spent.request_id)
            assert letter is not None and letter["deliveries"] == MAX_DELIVER
            assert letter["stream"] == f"WORK_POOL_{lane.pool}" and queue.swept >= 1

            async def moved_out() -> bool:  # of the work stream (its depth is cached for a moment)
                return await gateway.pending(lane.pool) == 0

            await eventually(moved_out, timeout_s=LONG_WAIT_S, what="the spent work leaving its stream")
            await queue.sweep()
            assert await letters_of_this_lane(queue) == [spent.request_id]  # stored once, whoever swept again
