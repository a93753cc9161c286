"""TtlCache: fresh values served without a load, one shared load per expired key, a cancelled loader hands on."""

from __future__ import annotations

import asyncio

import pytest

from sie.transport.nats.cache import TtlCache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_fresh_value_is_served_until_it_expires() -> None:
    clock = Clock()
    cache: TtlCache[str, int] = TtlCache(0.05, clock)
    loads = iter([1, 2])

    async def load() -> int:
        return next(loads)

    assert await cache.get("pool", load) == 1
    clock.now += 0.04
    assert await cache.get("pool", load) == 1
    clock.now += 0.02
    assert await cache.get("pool", load) == 2


async def test_concurrent_callers_share_one_load() -> None:
    cache: TtlCache[str, int] = TtlCache(1.0)
    release = asyncio.Event()
    calls = 0

    async def load() -> int:
        nonlocal calls
        calls += 1
        await release.wait()
        return 7

    waiting = [asyncio.ensure_future(cache.get("k", load)) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*waiting) == [7] * 5
    assert calls == 1


async def test_a_failed_load_reaches_every_waiter_and_is_not_cached() -> None:
    cache: TtlCache[str, int] = TtlCache(1.0)
    release = asyncio.Event()

    async def failing() -> int:
        await release.wait()
        raise RuntimeError("broker said no")

    waiting = [asyncio.ensure_future(cache.get("k", failing)) for _ in range(3)]
    await asyncio.sleep(0)
    release.set()
    outcomes = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(outcome, RuntimeError) for outcome in outcomes)

    async def working() -> int:
        return 3

    assert await cache.get("k", working) == 3


async def test_a_cancelled_leader_hands_the_load_to_a_follower() -> None:
    cache: TtlCache[str, int] = TtlCache(1.0)
    started = asyncio.Event()

    async def slow() -> int:
        started.set()
        await asyncio.sleep(10)
        return 1

    async def quick() -> int:
        return 2

    leader = asyncio.ensure_future(cache.get("k", slow))
    await started.wait()
    follower = asyncio.ensure_future(cache.get("k", quick))
    await asyncio.sleep(0)
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    assert await follower == 2


async def test_update_keeps_the_expiry_and_put_forget_work() -> None:
    clock = Clock()
    cache: TtlCache[str, int] = TtlCache(0.05, clock)
    cache.put("pool", 3)
    clock.now += 0.04
    cache.update("pool", lambda depth: depth + 1)
    assert cache.peek("pool") == (4,)
    clock.now += 0.02
    assert cache.peek("pool") is None
    cache.update("pool", lambda depth: depth + 1)  # stale: nothing to update
    assert cache.peek("pool") is None
    cache.put("pool", 5)
    cache.forget("pool")
    assert cache.peek("pool") is None
    assert cache.cached_keys() == []
