"""Pools in a JetStream KV bucket on a real nats-server (seed 000 §16.3: every gateway replica shares them): two
gateways' KeyValuePoolStores see each other's pools, leases expire and are swept, concurrent renewals and
replacements lose nothing, and broker failures surface as TransportError. Each test has a bucket of its own."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import attrs
import nats
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js import api

from launcher import NatsServer, free_port
from sie.pools import AssignedWorker, KeyValuePoolStore, Pool, PoolExistsError, PoolNotFoundError, PoolSpec
from sie.settings import StreamSettings
from sie.settings.messaging import NatsSettings
from sie.transport.base import TransportError, TransportUnavailable
from sie.transport.loopback import LoopbackTransport
from sie.transport.nats import POOL_BUCKET, NatsTransport
from sie.transport.reconnecting import ReconnectingTransport
from support.polling import eventually

T0 = 1_700_000_000.0
TTL_S = 60.0
BROKER_WAIT_S = 15.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def spec(name: str = "acme", ttl_s: float | None = TTL_S) -> PoolSpec:
    return PoolSpec(name=name, gpus={"l4": 1}, ttl_seconds=ttl_s)


def worker(index: int) -> AssignedWorker:
    return AssignedWorker(name=f"worker-{index}", machine_profile="l4", bundle="default")


@pytest.fixture
def bucket() -> str:
    return f"SIE_POOLS_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def gateways(nats_server: NatsServer, bucket: str, clock: Clock) -> AsyncIterator[list[KeyValuePoolStore]]:
    """Two gateways, each with its own NATS connection and a store on the same bucket."""
    async with AsyncExitStack() as stack:
        stores = []
        for index in range(2):
            settings = NatsSettings(url=nats_server.url)
            transport = await stack.enter_async_context(NatsTransport(settings, name=f"gw-{index}"))
            stores.append(KeyValuePoolStore(transport.key_value(bucket), clock=clock))
        yield stores


async def test_the_default_bucket_is_sie_pools_with_one_revision_per_key(tmp_path: Path) -> None:
    server = NatsServer(tmp_path)  # a server of its own: SIE_POOLS is the name every gateway shares
    try:
        async with NatsTransport(NatsSettings(url=server.url), StreamSettings(storage="file")) as transport:
            key_value = transport.key_value()
            assert (key_value.bucket, transport.key_value(POOL_BUCKET) is key_value) == ("SIE_POOLS", True)
            assert await key_value.keys() == []  # the first call creates the bucket
            client = await nats.connect(server.url)
            try:
                status = await (await client.jetstream().key_value(POOL_BUCKET)).status()
            finally:
                await client.close()
        config = status.stream_info.config
        # history 1; no bucket-wide max age (0): leases expire by their own expires_at
        assert (status.history, config.storage, config.max_age) == (1, api.StorageType.FILE, 0.0)
    finally:
        server.stop()


async def test_two_gateways_see_each_others_pools(gateways: list[KeyValuePoolStore]) -> None:
    first, second = gateways
    assert await first.list() == []
    acme = await first.create(Pool.leased(spec(), T0))
    zeta = await second.create(Pool.leased(spec("zeta"), T0))
    assert await second.get("acme") == acme
    assert await first.list() == [acme, zeta]
    with pytest.raises(PoolExistsError):
        await second.create(Pool.leased(spec(), T0))
    assigned = await second.replace(attrs.evolve(acme, assigned_workers=(worker(1),)))
    assert await first.get("acme") == assigned
    assert await first.delete("zeta")
    assert await second.list() == [assigned]
    assert not await second.delete("zeta")


async def test_an_expired_lease_reads_as_missing_is_replaced_and_swept(
    gateways: list[KeyValuePoolStore], clock: Clock, bucket: str, nats_client: Client
) -> None:
    first, second = gateways
    await first.create(Pool.leased(spec("short", ttl_s=10), T0))
    await first.create(Pool.leased(spec("long"), T0))
    clock.now = T0 + 10
    assert await second.get("short") is None
    with pytest.raises(PoolNotFoundError):
        await second.renew("short", clock.now)
    assert [pool.name for pool in await second.list()] == ["long"]
    assert await second.sweep(clock.now) == 1
    with pytest.raises(nats.js.errors.KeyNotFoundError):  # swept for good: a delete marker, no value
        await (await nats_client.jetstream().key_value(bucket)).get("short")
    clock.now = T0 + TTL_S
    fresh = await second.create(Pool.leased(spec("long"), clock.now))  # over the expired lease
    assert await first.get("long") == fresh
    recreated = await first.create(Pool.leased(spec("short", ttl_s=10), clock.now))  # over the delete marker
    assert await second.get("short") == recreated


async def test_concurrent_renewals_and_replacements_lose_no_write(gateways: list[KeyValuePoolStore]) -> None:
    first, second = gateways
    await first.create(Pool.leased(spec(), T0))
    stale = Pool.leased(spec(), T0)  # what the assignment round read before the renewals
    renewals = [first.renew("acme", T0 + offset) for offset in range(1, 21)]
    replacement = second.replace(attrs.evolve(stale, assigned_workers=(worker(1), worker(2))))
    await asyncio.gather(*renewals, replacement)
    for store in gateways:
        stored = await store.get("acme")
        assert stored is not None
        assert (stored.last_renewed, stored.expires_at) == (T0 + 20, T0 + 20 + TTL_S)
        assert stored.assigned_workers == (worker(1), worker(2))


async def test_concurrent_creates_of_one_name_leave_exactly_one(gateways: list[KeyValuePoolStore]) -> None:
    first, second = gateways
    attempts = [
        store.create(Pool.leased(attrs.evolve(spec(), minimum_worker_count=index), T0))
        for index, store in enumerate([first, second] * 4)
    ]
    outcomes = await asyncio.gather(*attempts, return_exceptions=True)
    created = [outcome for outcome in outcomes if isinstance(outcome, Pool)]
    assert len(created) == 1
    assert all(isinstance(outcome, PoolExistsError) for outcome in outcomes if not isinstance(outcome, Pool))
    assert await second.get("acme") == created[0]


async def test_a_bucket_deleted_behind_the_stores_back_is_created_again(
    gateways: list[KeyValuePoolStore], bucket: str, nats_client: Client
) -> None:
    first, _ = gateways
    await first.create(Pool.leased(spec(), T0))
    await nats_client.jetstream().delete_key_value(bucket)
    with pytest.raises(TransportError):  # the write finds no stream; the bucket is opened afresh next time
        await first.create(Pool.leased(spec("zeta"), T0))
    assert await first.list() == []
    await first.create(Pool.leased(spec("zeta"), T0))
    assert [pool.name for pool in await first.list()] == ["zeta"]


async def test_a_closed_transport_or_a_lost_broker_is_unavailable(tmp_path: Path, bucket: str) -> None:
    server = NatsServer(tmp_path)
    try:
        async with NatsTransport(NatsSettings(url=server.url)) as transport:
            store = KeyValuePoolStore(transport.key_value(bucket))
            await store.create(Pool.leased(spec(), T0))
            server.stop()
            await eventually(lambda: _unavailable(store), timeout_s=BROKER_WAIT_S, what="a failing read")
    finally:
        server.stop()
    with pytest.raises(TransportUnavailable, match="closed"):
        await store.list()


async def test_a_reconnecting_transport_opens_the_bucket_once_connected(tmp_path: Path, bucket: str) -> None:
    port = free_port()
    settings = NatsSettings(url=f"nats://127.0.0.1:{port}")
    reconnecting = ReconnectingTransport(lambda: NatsTransport(settings), initial_backoff_s=0.05, max_backoff_s=0.2)
    async with reconnecting as transport:
        store = KeyValuePoolStore(transport.key_value(bucket))
        with pytest.raises(TransportUnavailable, match="not connected"):
            await store.get("acme")
        server = NatsServer(tmp_path, port=port)
        try:
            await eventually(lambda: transport.unavailable_reason() is None, timeout_s=BROKER_WAIT_S,
                             what="the connection")  # fmt: skip
            pool = await store.create(Pool.leased(spec(ttl_s=None), T0))
            assert await store.list() == [pool]
        finally:
            server.stop()


async def test_a_reconnecting_transport_over_the_loopback_keeps_no_buckets() -> None:
    async with ReconnectingTransport(lambda: LoopbackTransport(StreamSettings())) as transport:
        await eventually(lambda: transport.unavailable_reason() is None, what="the connection")
        with pytest.raises(TransportError, match="LoopbackTransport keeps no key-value buckets"):
            await transport.key_value(POOL_BUCKET).keys()


async def _unavailable(store: KeyValuePoolStore) -> bool:
    try:
        await store.get("acme")
    except TransportUnavailable:
        return True
    return False
