"""The sweep of gone workers' direct-dispatch streams on a real nats-server: streams made by the sidecar's own
`StreamRegistry.ensure_worker_consumer` with a short max_age, swept through the gateway's transport. A stream of no
live worker, empty and idle past max_age goes (whether its message aged out or it never had one) and is counted; a
live worker's, a non-empty and a young one stay; a stream another gateway swept first, or one that changed since it
was listed, is left without an error.

The server is shared: the live workers given to the sweep include every worker stream that other tests left."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js import api

from launcher import NatsServer
from sie.catalog.names import work_worker_stream_name, work_worker_stream_subjects, work_worker_subject
from sie.gateway.worker_streams import WorkerStreamSweep
from sie.settings import StreamSettings
from sie.settings.messaging import NatsSettings
from sie.telemetry.gateway import WorkerStreamMetrics
from sie.telemetry.metrics import Telemetry
from sie.transport.base import Lane
from sie.transport.nats import NatsTransport
from sie.transport.nats.connection import Connection
from sie.transport.nats.streams import StreamRegistry
from support.polling import eventually

MAX_AGE_S = 1.5
SETTINGS = StreamSettings(max_age_s=MAX_AGE_S)  # duplicate_window follows it down (JetStream wants it <= max_age)
MODEL = "org/model"
PREFIX = "WORK_WORKER_"


@pytest.fixture
def lane() -> Lane:
    return Lane(pool=f"ws{uuid.uuid4().hex[:10]}", machine_profile="l4", bundle="default")


@pytest.fixture
async def sidecar(nats_server: NatsServer) -> AsyncIterator[StreamRegistry]:
    """The stream registry a sidecar with direct dispatch ensures its worker's stream and consumer through."""
    connection = await Connection.open(NatsSettings(url=nats_server.url))
    try:
        yield StreamRegistry(connection, SETTINGS)
    finally:
        await connection.close()


@pytest.fixture
async def gateway(nats_server: NatsServer) -> AsyncIterator[NatsTransport]:
    async with NatsTransport(NatsSettings(url=nats_server.url), SETTINGS) as transport:
        yield transport


async def _exists(client: Client, name: str) -> bool:
    try:
        await client.jsm().stream_info(name)
    except nats.js.errors.NotFoundError:
        return False
    return True


async def _publish(client: Client, lane: Lane, worker: str) -> None:
    subject = work_worker_subject(lane.pool, lane.machine_profile, lane.bundle, MODEL, worker)
    await client.jetstream().publish(subject, b"work")


async def _left_by_other_tests(transport: NatsTransport, ours: set[str]) -> set[str]:
    """The worker ids of the worker streams not made here (a stream name's token is its worker's normalised id)."""
    return {stream.name.removeprefix(PREFIX) for stream in await transport.worker_streams() if stream.name not in ours}


async def test_only_the_empty_idle_streams_of_gone_workers_are_swept_once(
    nats_server: NatsServer, nats_client: Client, lane: Lane, sidecar: StreamRegistry, gateway: NatsTransport
) -> None:
    tag = lane.pool
    unused, aged, live, full, young = (f"{tag}-{role}" for role in ("unused", "aged", "live", "full", "young"))
    for worker in (unused, aged, live):
        await sidecar.ensure_worker_consumer(lane, worker)
    await _publish(nats_client, lane, aged)  # nobody takes it: it ages out after max_age
    # A stream of an older sidecar that kept messages forever (max_age 0): it still holds one past SETTINGS' max_age.
    await nats_client.jsm().add_stream(
        name=work_worker_stream_name(full), retention=api.RetentionPolicy.WORK_QUEUE, storage=api.StorageType.MEMORY,
        subjects=work_worker_stream_subjects(lane.pool, lane.machine_profile, lane.bundle, full),
    )  # fmt: skip
    await _publish(nats_client, lane, full)
    idle_from = time.time()

    async def aged_out_and_idle() -> bool:
        info = await nats_client.jsm().stream_info(work_worker_stream_name(aged))
        return info.state.messages == 0 and time.time() - idle_from > MAX_AGE_S + 0.1

    await eventually(aged_out_and_idle, timeout_s=MAX_AGE_S + 5, interval_s=0.05, what=f"{aged}'s message to age out")
    await sidecar.ensure_worker_consumer(lane, young)

    ours = {work_worker_stream_name(worker) for worker in (unused, aged, live, full, young)}
    others = await _left_by_other_tests(gateway, ours)
    telemetry = Telemetry()
    sweep = WorkerStreamSweep(gateway, lambda: {live, *others}, MAX_AGE_S, metrics=WorkerStreamMetrics(telemetry))
    swept = await sweep.sweep()

    assert sorted(stream.name for stream in swept) == sorted(work_worker_stream_name(w) for w in (unused, aged))
    assert sweep.swept == 2
    assert b"sie_gateway_worker_streams_swept_total 2.0" in telemetry.prometheus_text()
    for worker in (unused, aged):
        assert not await _exists(nats_client, work_worker_stream_name(worker))
    for worker in (live, full, young):
        assert await _exists(nats_client, work_worker_stream_name(worker)), worker

    # Another gateway sweeping after it, or deleting what it listed before the first one deleted it: no error.
    async with NatsTransport(NatsSettings(url=nats_server.url), SETTINGS) as other:
        assert await WorkerStreamSweep(other, lambda: {live, *others}, MAX_AGE_S).sweep() == []
        assert await other.delete_worker_stream(swept[0]) is False


async def test_a_stream_that_changed_since_it_was_listed_is_not_deleted(
    nats_client: Client, lane: Lane, sidecar: StreamRegistry, gateway: NatsTransport
) -> None:
    written, recreated = f"{lane.pool}-written", f"{lane.pool}-recreated"
    for worker in (written, recreated):
        await sidecar.ensure_worker_consumer(lane, worker)
    listed = {stream.name: stream for stream in await gateway.worker_streams()}
    await _publish(nats_client, lane, written)
    await nats_client.jsm().delete_stream(work_worker_stream_name(recreated))
    await sidecar.reattach_worker(lane, recreated)  # the worker came back under the same name

    for worker in (written, recreated):
        name = work_worker_stream_name(worker)
        assert await gateway.delete_worker_stream(listed[name]) is False
        assert await _exists(nats_client, name), worker
    now = {stream.name: stream for stream in await gateway.worker_streams()}
    assert now[work_worker_stream_name(written)].messages == 1
    assert await gateway.delete_worker_stream(now[work_worker_stream_name(recreated)]) is True
    assert not await _exists(nats_client, work_worker_stream_name(recreated))
