"""Pool streams and lane consumers on a real nats-server: created lazily with the seed's configuration, and an
existing stream reconciled (subjects, max_age, discard) but never its storage (seed 000 §8.2)."""

from __future__ import annotations

import logging
import time
import uuid

import pytest
from nats.aio.client import Client
from nats.js import api

from launcher import NatsServer
from sie.catalog.names import work_subject
from sie.settings import StreamSettings
from sie.settings.messaging import NatsSettings
from sie.transport.base import Lane
from sie.transport.nats import NatsTransport
from sie.wire.queue import WorkItem

MODEL = "BAAI/bge-m3"


@pytest.fixture
def lane() -> Lane:
    return Lane(pool=f"s{uuid.uuid4().hex[:12]}", machine_profile="l4", bundle="default")


def _transport(server: NatsServer, **settings: object) -> NatsTransport:
    return NatsTransport(NatsSettings(url=server.url), StreamSettings(**settings))  # type: ignore[arg-type]


def _item(lane: Lane) -> WorkItem:
    return WorkItem(
        work_item_id="r.0", request_id="r", item_index=0, total_items=1, operation="encode", model_id=MODEL,
        profile_id="default", pool_name=lane.pool, machine_profile=lane.machine_profile, router_id="gw-1",
        reply_subject="_INBOX.gw-1.r", timestamp=time.time(), item={"text": "hello"},
    )  # fmt: skip


def _subject(lane: Lane) -> str:
    return work_subject(lane.pool, lane.machine_profile, lane.bundle, MODEL)


async def test_a_consumer_creates_the_stream_and_its_durable_lane_consumer(
    nats_server: NatsServer, nats_client: Client, lane: Lane
) -> None:
    settings = {"max_msgs": 100_000, "max_age_s": 1800.0, "ack_wait_s": 30.0, "max_deliver": 20}
    async with _transport(nats_server, **settings) as transport:
        await transport.consumer(lane)
    jsm = nats_client.jsm()
    stream = await jsm.stream_info(f"WORK_POOL_{lane.pool}")
    assert stream.config.subjects == [f"sie.work.{lane.pool}.*.*.*"]
    assert stream.config.retention == "workqueue"
    assert stream.config.storage == "memory"
    assert stream.config.discard == "new"
    assert (stream.config.max_msgs, stream.config.max_age, stream.config.num_replicas) == (100_000, 1800.0, 1)
    consumer = await jsm.consumer_info(f"WORK_POOL_{lane.pool}", f"{lane.pool}_l4_default")
    assert consumer.config.durable_name == f"{lane.pool}_l4_default"
    assert consumer.config.filter_subject == f"sie.work.{lane.pool}.l4.default.*"
    assert consumer.config.ack_policy == "explicit"
    assert (consumer.config.ack_wait, consumer.config.max_deliver) == (30.0, 20)


async def test_a_publish_creates_the_stream_too(nats_server: NatsServer, nats_client: Client, lane: Lane) -> None:
    async with _transport(nats_server) as transport:
        await transport.publish_work(_subject(lane), _item(lane))
        assert await transport.pending(lane.pool) == 1
    stream = await nats_client.jsm().stream_info(f"WORK_POOL_{lane.pool}")
    assert stream.state.messages == 1


async def test_an_existing_stream_is_reconciled_to_the_settings(
    nats_server: NatsServer, nats_client: Client, lane: Lane
) -> None:
    name, legacy = f"WORK_POOL_{lane.pool}", f"sie.work.*.{lane.pool}"
    jsm = nats_client.jsm()
    await jsm.add_stream(
        name=name, subjects=[f"sie.work.{lane.pool}.*.*.*", legacy], retention=api.RetentionPolicy.WORK_QUEUE,
        storage=api.StorageType.MEMORY, max_age=3600.0, discard=api.DiscardPolicy.OLD, max_msgs=100_000,
    )  # fmt: skip
    async with _transport(nats_server, max_age_s=600.0) as transport:
        await transport.publish_work(_subject(lane), _item(lane))
    config = (await jsm.stream_info(name)).config
    assert config.subjects == [f"sie.work.{lane.pool}.*.*.*"]  # the legacy subject is gone
    assert (config.max_age, config.discard) == (600.0, "new")
    assert config.storage == "memory"


async def test_storage_is_never_changed_only_warned(
    nats_server: NatsServer, nats_client: Client, lane: Lane, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"WORK_POOL_{lane.pool}"
    jsm = nats_client.jsm()
    await jsm.add_stream(
        name=name, subjects=[f"sie.work.{lane.pool}.*.*.*"], retention=api.RetentionPolicy.WORK_QUEUE,
        storage=api.StorageType.FILE, max_age=1800.0, discard=api.DiscardPolicy.NEW, max_msgs=100_000,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="sie.transport.nats"):
        async with _transport(nats_server, storage="memory") as transport:
            await transport.publish_work(_subject(lane), _item(lane))
            assert await transport.pending(lane.pool) == 1
    assert "uses file storage but settings ask for memory" in caplog.text
    assert (await jsm.stream_info(name)).config.storage == "file"


async def test_an_existing_consumer_takes_the_settings(
    nats_server: NatsServer, nats_client: Client, lane: Lane
) -> None:
    async with _transport(nats_server, ack_wait_s=5.0, max_deliver=3) as transport:
        await transport.consumer(lane)
    async with _transport(nats_server, ack_wait_s=30.0, max_deliver=20) as transport:
        await transport.consumer(lane)
    consumer = await nats_client.jsm().consumer_info(f"WORK_POOL_{lane.pool}", f"{lane.pool}_l4_default")
    assert (consumer.config.ack_wait, consumer.config.max_deliver) == (30.0, 20)


async def test_a_stream_deleted_behind_our_back_is_created_again(
    nats_server: NatsServer, nats_client: Client, lane: Lane
) -> None:
    async with _transport(nats_server) as transport:
        await transport.publish_work(_subject(lane), _item(lane))
        await nats_client.jsm().delete_stream(f"WORK_POOL_{lane.pool}")
        await transport.publish_work(_subject(lane), _item(lane))
    assert (await nats_client.jsm().stream_info(f"WORK_POOL_{lane.pool}")).state.messages == 1


async def test_has_consumer_sees_a_consumer_another_process_made(nats_server: NatsServer, lane: Lane) -> None:
    async with _transport(nats_server) as sidecar, _transport(nats_server) as gateway:
        await sidecar.consumer(lane)
        assert await gateway.has_consumer(lane)
        assert not await gateway.has_consumer(Lane(lane.pool, lane.machine_profile, "other"))
