"""Idempotency-Key semantics of the config service: concurrency, cancellation before and after commit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from sie.control.errors import IdempotencyMismatchError, InflightCancelledError, ValidationFailedError
from sie.control.idempotency import IdempotencyCache, post_fingerprint, put_fingerprint


def test_fingerprints() -> None:
    import hashlib

    assert post_fingerprint(b"x") == hashlib.sha256(b"x").hexdigest()
    assert put_fingerprint("a/b", b"x") == hashlib.sha256(b"PUT\0a/b\0x").hexdigest()


async def test_owner_cancelled_before_commit_gives_waiters_503_and_is_not_cached() -> None:
    cache: IdempotencyCache[str] = IdempotencyCache()
    gate = asyncio.Event()
    runs = []

    async def slow(enter_commit: Callable[[], None]) -> str:
        runs.append(1)
        await gate.wait()
        enter_commit()
        return "done"

    owner = asyncio.create_task(cache.run("k", "fp", slow))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(cache.run("k", "fp", slow))
    await asyncio.sleep(0)
    owner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await owner
    with pytest.raises(InflightCancelledError):
        await waiter
    gate.set()
    assert await cache.run("k", "fp", slow) == "done"  # a later retry runs afresh
    assert len(runs) == 2


async def test_owner_cancelled_during_commit_gives_waiters_the_real_outcome() -> None:
    cache: IdempotencyCache[str] = IdempotencyCache()
    committing, finish = asyncio.Event(), asyncio.Event()

    async def commit(enter_commit: Callable[[], None]) -> str:
        enter_commit()
        committing.set()
        await finish.wait()
        return "committed"

    owner = asyncio.create_task(cache.run("k", "fp", commit))
    await committing.wait()
    waiter = asyncio.create_task(cache.run("k", "fp", commit))
    await asyncio.sleep(0)
    owner.cancel()
    await asyncio.sleep(0)
    finish.set()
    with pytest.raises(asyncio.CancelledError):
        await owner
    assert await waiter == "committed"
    assert await cache.run("k", "fp", commit) == "committed"  # cached


async def test_owner_failure_reaches_waiters_and_is_not_cached() -> None:
    cache: IdempotencyCache[str] = IdempotencyCache()
    gate = asyncio.Event()

    async def failing(_enter_commit: Callable[[], None]) -> str:
        await gate.wait()
        raise ValidationFailedError(["bad"])

    owner = asyncio.create_task(cache.run("k", "fp", failing))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(cache.run("k", "fp", failing))
    await asyncio.sleep(0)
    gate.set()
    for task in (owner, waiter):
        with pytest.raises(ValidationFailedError):
            await task

    async def ok(_enter_commit: Callable[[], None]) -> str:
        return "ok"

    assert await cache.run("k", "fp", ok) == "ok"


async def test_mismatch_while_in_flight_and_lru_eviction() -> None:
    cache: IdempotencyCache[str] = IdempotencyCache(capacity=2)
    gate = asyncio.Event()

    async def wait(_enter_commit: Callable[[], None]) -> str:
        await gate.wait()
        return "v"

    owner = asyncio.create_task(cache.run("k", "fp", wait))
    await asyncio.sleep(0)
    with pytest.raises(IdempotencyMismatchError):
        await cache.run("k", "other", wait)
    gate.set()
    await owner
    await cache.run("a", "1", wait)
    await cache.run("b", "1", wait)
    assert await cache.run("k", "other", wait) == "v"  # "k" was evicted: the key is free again
