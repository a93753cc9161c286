"""The pool stores (DESIGN.md §4): MemoryPoolStore and KeyValuePoolStore answer alike (the tests run over both),
and KeyValuePoolStore's compare-and-set writes keep what another gateway wrote between its read and its write."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import attrs
import pytest

from sie.pools import (
    AssignedWorker,
    KeyValueEntry,
    KeyValuePoolStore,
    MemoryPoolStore,
    Pool,
    PoolConflictError,
    PoolExistsError,
    PoolNotFoundError,
    PoolSpec,
    PoolStore,
)
from sie.pools.store import MAX_WRITE_ATTEMPTS
from sie.wire import dumps_json

T0 = 1_700_000_000.0
TTL_S = 60.0
WORKER = AssignedWorker(name="worker-1", machine_profile="l4", bundle="default")


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class DictKeyValue:
    """A KeyValue in a dict with JetStream's revision rules: one sequence across the bucket, a delete removes."""

    def __init__(self) -> None:
        self.entries: dict[str, KeyValueEntry] = {}
        self._sequence = 0

    async def get(self, key: str) -> KeyValueEntry | None:
        return self.entries.get(key)

    async def create(self, key: str, value: bytes) -> int | None:
        return None if key in self.entries else self._put(key, value)

    async def update(self, key: str, value: bytes, revision: int) -> int | None:
        entry = self.entries.get(key)
        return self._put(key, value) if entry is not None and entry.revision == revision else None

    async def delete(self, key: str, revision: int | None = None) -> bool:
        entry = self.entries.get(key)
        if entry is None or (revision is not None and entry.revision != revision):
            return False
        del self.entries[key]
        return True

    async def keys(self) -> list[str]:
        return list(self.entries)

    def _put(self, key: str, value: bytes) -> int:
        self._sequence += 1
        self.entries[key] = KeyValueEntry(value, self._sequence)
        return self._sequence


class Interfering:
    """A bucket whose next `times` compare-and-set writes each run `interfere()` (another gateway's write) first."""

    def __init__(self, bucket: DictKeyValue) -> None:
        self.bucket = bucket
        self.interfere: Callable[[], Awaitable[object]] | None = None
        self.times = 0

    async def _before_write(self) -> None:
        if self.interfere is not None and self.times > 0:
            self.times -= 1
            await self.interfere()

    async def get(self, key: str) -> KeyValueEntry | None:
        return await self.bucket.get(key)

    async def keys(self) -> list[str]:
        return await self.bucket.keys()

    async def create(self, key: str, value: bytes) -> int | None:
        await self._before_write()
        return await self.bucket.create(key, value)

    async def update(self, key: str, value: bytes, revision: int) -> int | None:
        await self._before_write()
        return await self.bucket.update(key, value, revision)

    async def delete(self, key: str, revision: int | None = None) -> bool:
        await self._before_write()
        return await self.bucket.delete(key, revision)


def spec(name: str = "acme", ttl_s: float | None = TTL_S) -> PoolSpec:
    return PoolSpec(name=name, gpus={"l4": 1}, ttl_seconds=ttl_s)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["memory", "key-value"])
def store(request: pytest.FixtureRequest, clock: Clock) -> PoolStore:
    if request.param == "memory":
        return MemoryPoolStore(clock=clock)
    return KeyValuePoolStore(DictKeyValue(), clock=clock)


async def test_a_created_pool_is_read_back_by_name_and_listed(store: PoolStore) -> None:
    assert await store.list() == []
    assert await store.get("acme") is None
    zeta, acme = Pool.leased(spec("zeta"), T0), Pool.leased(spec("acme"), T0)
    assert await store.create(zeta) == zeta
    await store.create(acme)
    assert await store.get("ACME") == acme
    assert await store.list() == [acme, zeta]


async def test_a_live_pool_cannot_be_created_twice_but_an_expired_one_is_replaced(
    store: PoolStore, clock: Clock
) -> None:
    await store.create(Pool.leased(spec(), T0))
    with pytest.raises(PoolExistsError, match="'acme' already exists"):
        await store.create(Pool.leased(spec(), T0 + 1))
    clock.now = T0 + TTL_S
    assert await store.get("acme") is None
    assert await store.list() == []
    fresh = Pool.leased(spec(), clock.now)
    assert await store.create(fresh) == fresh
    assert await store.get("acme") == fresh


async def test_a_renewal_extends_the_lease(store: PoolStore, clock: Clock) -> None:
    await store.create(Pool.leased(spec(), T0))
    renewed = await store.renew("Acme", T0 + 50)
    assert (renewed.created_at, renewed.last_renewed, renewed.expires_at) == (T0, T0 + 50, T0 + 110)
    clock.now = T0 + 100
    assert await store.get("acme") == renewed
    assert (await store.renew("acme", T0 + 20)).expires_at == T0 + 110  # a late renewal never shortens it


async def test_a_pool_without_a_ttl_never_expires(store: PoolStore, clock: Clock) -> None:
    pool = await store.create(Pool.leased(spec(ttl_s=None), T0))
    clock.now = T0 + 10 * 365 * 86400
    assert await store.get("acme") == pool
    assert await store.sweep(clock.now) == 0
    assert (await store.renew("acme", clock.now)).expires_at is None


async def test_renewing_a_missing_or_expired_pool_is_not_found(store: PoolStore) -> None:
    with pytest.raises(PoolNotFoundError, match="'acme' not found"):
        await store.renew("acme", T0)
    await store.create(Pool.leased(spec(), T0))
    with pytest.raises(PoolNotFoundError):
        await store.renew("acme", T0 + TTL_S)


async def test_a_replace_takes_spec_and_workers_and_keeps_creation_and_the_later_lease(store: PoolStore) -> None:
    await store.create(Pool.leased(spec(), T0))
    await store.renew("acme", T0 + 30)
    stale = Pool.leased(attrs.evolve(spec(), minimum_worker_count=2), T0 + 10)
    written = await store.replace(attrs.evolve(stale, assigned_workers=(WORKER,)))
    assert await store.get("acme") == written
    assert (written.spec.minimum_worker_count, written.assigned_workers) == (2, (WORKER,))
    assert (written.created_at, written.last_renewed, written.expires_at) == (T0, T0 + 30, T0 + 90)


async def test_replacing_a_missing_or_expired_pool_is_not_found(store: PoolStore, clock: Clock) -> None:
    with pytest.raises(PoolNotFoundError):
        await store.replace(Pool.leased(spec(), T0))
    await store.create(Pool.leased(spec(), T0))
    clock.now = T0 + TTL_S
    with pytest.raises(PoolNotFoundError):
        await store.replace(Pool.leased(spec(), T0))


async def test_delete_says_whether_a_live_pool_was_removed(store: PoolStore, clock: Clock) -> None:
    assert not await store.delete("acme")
    await store.create(Pool.leased(spec(), T0))
    assert await store.delete("ACME")
    assert await store.get("acme") is None
    assert not await store.delete("acme")
    await store.create(Pool.leased(spec(), T0))
    clock.now = T0 + TTL_S
    assert not await store.delete("acme")  # expired: not found, and removed all the same
    assert await store.sweep(clock.now) == 0


async def test_a_sweep_removes_only_expired_leases(store: PoolStore, clock: Clock) -> None:
    await store.create(Pool.leased(spec("short", ttl_s=10), T0))
    await store.create(Pool.leased(spec("long", ttl_s=100), T0))
    await store.create(Pool.leased(spec("forever", ttl_s=None), T0))
    assert await store.sweep(T0 + 9) == 0
    assert await store.sweep(T0 + 10) == 1
    clock.now = T0 + 10
    assert [pool.name for pool in await store.list()] == ["forever", "long"]
    assert await store.sweep(T0 + 10) == 0


# KeyValuePoolStore only: what another gateway does between a read and a write.


@pytest.fixture
def shared() -> Interfering:
    return Interfering(DictKeyValue())


def gateways(shared: Interfering, clock: Clock) -> tuple[KeyValuePoolStore, KeyValuePoolStore]:
    """Two gateways' stores on one bucket; only the first one's writes meet interference."""
    return KeyValuePoolStore(shared, clock=clock), KeyValuePoolStore(shared.bucket, clock=clock)


async def test_two_stores_on_one_bucket_see_each_others_pools(shared: Interfering, clock: Clock) -> None:
    first, second = gateways(shared, clock)
    pool = await first.create(Pool.leased(spec(), T0))
    assert await second.get("acme") == pool
    with pytest.raises(PoolExistsError):
        await second.create(Pool.leased(spec(), T0))
    assert await second.delete("acme")
    assert await first.list() == []


async def test_a_replace_keeps_a_renewal_made_between_its_read_and_its_write(shared: Interfering, clock: Clock) -> None:
    first, second = gateways(shared, clock)
    await first.create(Pool.leased(spec(), T0))
    shared.interfere, shared.times = lambda: second.renew("acme", T0 + 40), 1
    written = await first.replace(attrs.evolve(Pool.leased(spec(), T0), assigned_workers=(WORKER,)))
    assert (written.assigned_workers, written.last_renewed) == ((WORKER,), T0 + 40)
    assert await second.get("acme") == written


async def test_a_renewal_keeps_workers_assigned_between_its_read_and_its_write(
    shared: Interfering, clock: Clock
) -> None:
    first, second = gateways(shared, clock)
    await first.create(Pool.leased(spec(), T0))
    assigned = attrs.evolve(Pool.leased(spec(), T0), assigned_workers=(WORKER,))
    shared.interfere, shared.times = lambda: second.replace(assigned), 1
    renewed = await first.renew("acme", T0 + 40)
    assert (renewed.assigned_workers, renewed.last_renewed) == ((WORKER,), T0 + 40)
    assert await second.get("acme") == renewed


async def test_a_create_racing_another_gateways_create_is_refused(shared: Interfering, clock: Clock) -> None:
    first, second = gateways(shared, clock)
    theirs = Pool.leased(attrs.evolve(spec(), minimum_worker_count=3), T0)
    shared.interfere, shared.times = lambda: second.create(theirs), 1
    with pytest.raises(PoolExistsError):
        await first.create(Pool.leased(spec(), T0))
    assert await first.get("acme") == theirs


async def test_a_sweep_keeps_a_lease_renewed_after_it_was_read(shared: Interfering, clock: Clock) -> None:
    first, second = gateways(shared, clock)
    await first.create(Pool.leased(spec(), T0))
    shared.interfere, shared.times = lambda: second.renew("acme", T0 + TTL_S - 1), 1
    assert await first.sweep(T0 + TTL_S) == 0
    assert (await second.get("acme")) is not None


async def test_a_delete_retries_when_the_pool_changed_after_it_was_read(shared: Interfering, clock: Clock) -> None:
    first, second = gateways(shared, clock)
    await first.create(Pool.leased(spec(), T0))
    shared.interfere, shared.times = lambda: second.renew("acme", T0 + 5), 1
    assert await first.delete("acme")
    assert await second.get("acme") is None


async def test_writers_that_always_get_there_first_end_in_a_conflict(shared: Interfering, clock: Clock) -> None:
    first, second = gateways(shared, clock)
    await first.create(Pool.leased(spec(), T0))
    renewals: Iterator[float] = iter(range(1, 10 * MAX_WRITE_ATTEMPTS))
    shared.interfere, shared.times = lambda: second.renew("acme", T0 + next(renewals)), MAX_WRITE_ATTEMPTS
    with pytest.raises(PoolConflictError, match=f"could not replace pool 'acme'.*{MAX_WRITE_ATTEMPTS} attempts"):
        await first.replace(attrs.evolve(Pool.leased(spec(), T0), assigned_workers=(WORKER,)))
    kept = await first.get("acme")
    assert kept is not None and kept.assigned_workers == ()


async def test_a_value_that_is_no_pool_reads_as_missing_and_a_create_replaces_it(clock: Clock) -> None:
    bucket = DictKeyValue()
    store = KeyValuePoolStore(bucket, clock=clock)
    await bucket.create("acme", b"{not json")
    await bucket.create("zeta", dumps_json(Pool.leased(spec("other"), T0).to_json(T0)))  # under another's name
    assert await store.get("acme") is None
    assert await store.list() == []
    with pytest.raises(PoolNotFoundError):
        await store.renew("acme", T0)
    pool = await store.create(Pool.leased(spec(), T0))
    assert await store.get("acme") == pool
