"""A small time-to-live cache with single-flight loading, for broker lookups a hot path must not repeat:
stream info for `pending` (50 ms), consumer existence (1 s), and ensured streams and consumers (forever).

Pure asyncio, no nats-py: concurrent callers of one expired key share one load; the loader runs in the
first caller's task, so a cancelled first caller hands the load on to the next instead of failing them.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

FOREVER = math.inf


class _LeaderCancelled(Exception):
    """The caller doing a shared load was cancelled; its followers try again themselves."""


class TtlCache(Generic[K, V]):
    """Values by key, each fresh for `ttl_s` seconds after it was loaded or put."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[K, tuple[V, float]] = {}
        self._loading: dict[K, asyncio.Future[V]] = {}

    def peek(self, key: K) -> tuple[V] | None:
        """`(value,)` while the entry is fresh, else None."""
        entry = self._entries.get(key)
        if entry is None or entry[1] <= self._clock():
            return None
        return (entry[0],)

    def put(self, key: K, value: V) -> None:
        """Store `value` as fresh now."""
        self._entries[key] = (value, self._clock() + self._ttl_s)

    def update(self, key: K, change: Callable[[V], V]) -> None:
        """Replace a fresh entry by `change(value)`, keeping its expiry (a no-op once it is stale)."""
        entry = self._entries.get(key)
        if entry is not None and entry[1] > self._clock():
            self._entries[key] = (change(entry[0]), entry[1])

    def cached_keys(self) -> list[K]:
        """Every key with an entry, fresh or not."""
        return list(self._entries)

    def cached_values(self) -> list[V]:
        """Every stored value, fresh or not."""
        return [value for value, _ in self._entries.values()]

    def forget(self, key: K) -> None:
        """Drop the entry; the next `get` loads again."""
        self._entries.pop(key, None)

    async def get(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        """The fresh value, else the result of one `load()` shared by every concurrent caller."""
        while True:
            fresh = self.peek(key)
            if fresh is not None:
                return fresh[0]
            shared = self._loading.get(key)
            if shared is None:
                return await self._lead(key, load)
            try:
                return await asyncio.shield(shared)
            except _LeaderCancelled:
                continue

    async def _lead(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        shared: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        shared.add_done_callback(_mark_retrieved)
        self._loading[key] = shared
        try:
            value = await load()
        except asyncio.CancelledError:
            shared.set_exception(_LeaderCancelled())
            raise
        except Exception as exc:
            shared.set_exception(exc)
            raise
        else:
            self.put(key, value)
            shared.set_result(value)
            return value
        finally:
            del self._loading[key]


def _mark_retrieved(future: asyncio.Future[object]) -> None:
    # Followers may all be gone; reading the exception keeps asyncio from logging it as never retrieved.
    if not future.cancelled():
        future.exception()
