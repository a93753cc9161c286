"""The gateway's pool directory against a store another gateway writes to: a pool this gateway learns while a refresh
is listing the store (its listing taken before the pool existed) stays resolvable, a name found on the store is never
remembered as a miss, and requests that arrive while a pool is read wait for that read (each of which once answered a
capped pool's requests POOL_NOT_FOUND for seconds, tests/e2e/test_pools.py)."""

from __future__ import annotations

import asyncio
import time

from sie.gateway.pools import PoolDirectory
from sie.pools import MemoryPoolStore, Pool, parse_pool_spec


class SlowListing(MemoryPoolStore):
    """A store whose listing is taken at once but answered only when the test says: a refresh in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.listed = asyncio.Event()
        self.answer = asyncio.Event()

    async def list(self) -> list[Pool]:
        snapshot = await super().list()
        self.listed.set()
        await self.answer.wait()
        return snapshot


def pool(name: str) -> Pool:
    return Pool.leased(parse_pool_spec({"name": name, "gpus": {"default": 1}}, 300.0), time.time())


def directory(store: MemoryPoolStore) -> PoolDirectory:
    return PoolDirectory(store, (), 300.0, lambda: [], refresh_interval_s=3600.0)


async def test_a_pool_learned_during_a_refresh_outlives_the_refreshs_older_listing() -> None:
    store = SlowListing()
    pools = directory(store)
    refreshing = asyncio.ensure_future(pools.refresh())
    await store.listed.wait()
    await store.create(pool("capped"))  # another gateway creates it after the listing was taken
    assert (await pools.target("capped")) is not None  # read through
    store.answer.set()
    await refreshing
    assert (await pools.target("capped")) is not None
    assert "capped" in [listed.name for listed in pools.pools()]
    store.answer.clear()
    store.answer.set()
    await pools.refresh()  # the next round lists it itself
    assert (await pools.target("capped")) is not None


async def test_a_name_found_on_the_store_is_not_remembered_as_a_miss() -> None:
    store = MemoryPoolStore()
    pools = directory(store)
    assert (await pools.target("later")) is None  # a real miss: not re-read for a while
    await store.create(pool("found"))
    assert (await pools.target("found")) is not None
    await pools.refresh()  # a listing that has it
    pools._live.clear()  # as a refresh whose listing predates it would leave the directory  # noqa: SLF001
    assert (await pools.target("found")) is not None  # read through again, not refused as a remembered miss


class SlowGet(MemoryPoolStore):
    """A store whose reads take a while, and that counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def get(self, name: str) -> Pool | None:
        self.reads += 1
        await asyncio.sleep(0.05)
        return await super().get(name)


async def test_requests_arriving_while_a_pool_is_read_wait_for_that_read() -> None:
    store = SlowGet()
    await store.create(pool("capped"))
    store.reads = 0
    pools = directory(store)
    targets = await asyncio.gather(*(pools.target("capped") for _ in range(40)))
    assert all(target is not None for target in targets)  # none taken for a miss by the read in flight
    assert store.reads == 1
