"""Where pools live between requests (DESIGN.md §4 Stores): the PoolStore seam, MemoryPoolStore for one process
and KeyValuePoolStore over any key-value bucket with revisions (a JetStream KV bucket shared by every gateway
replica). Stores keep leased pools only; the protected pools are the deployment's and never stored.

Every write of KeyValuePoolStore is a compare-and-set on the revision it read, retried on a fresh read when another
writer got there first, so two gateways never lose each other's writes. Both stores answer alike: a pool whose
lease ran out reads as missing and is replaced by a create; `sweep` removes such leases for good.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final, Protocol

import attrs

from sie.pools.pool import Pool, replacement
from sie.pools.spec import InvalidPoolError, PoolConflictError, PoolExistsError, PoolNotFoundError, canonical_pool_name
from sie.wire import DecodeError, dumps_json, loads_json

logger = logging.getLogger(__name__)

# Compare-and-set attempts of one store call. Each lost attempt means another writer's write landed meanwhile, so
# a call among N concurrent writers of one pool needs at most N attempts: this bounds gateways x writers per pool.
MAX_WRITE_ATTEMPTS: Final = 64

Clock = Callable[[], float]


class PoolStore(Protocol):
    """Leased pools by name (canonical, see canonical_pool_name); expiry is judged by the store's clock."""

    async def list(self) -> list[Pool]:
        """Every live pool, by name."""

    async def get(self, name: str) -> Pool | None:
        """The live pool of that name; None when there is none or its lease ran out."""

    async def create(self, pool: Pool) -> Pool:
        """Store a new pool; PoolExistsError while a live one has its name (an expired one is replaced)."""

    async def replace(self, pool: Pool) -> Pool:
        """Overwrite a live pool's spec and assigned workers, keeping its creation time and the later of the two
        leases (see `replacement`); returns what was stored. PoolNotFoundError when there is no live pool."""

    async def renew(self, name: str, now: float) -> Pool:
        """Renew the lease at `now`; PoolNotFoundError when there is no pool live at `now`."""

    async def delete(self, name: str) -> bool:
        """Remove the pool; False when there was no live one (an expired lease is removed all the same)."""

    async def sweep(self, now: float) -> int:
        """Remove every pool whose lease ran out by `now`; returns how many."""


@attrs.frozen
class KeyValueEntry:
    """A stored value and the revision it was stored at (what a compare-and-set names)."""

    value: bytes
    revision: int


class KeyValue(Protocol):
    """A key-value bucket with revisions (JetStream KV semantics); keys are pool names."""

    async def get(self, key: str) -> KeyValueEntry | None:
        """The key's value; None when it has none (never written, or deleted)."""

    async def create(self, key: str, value: bytes) -> int | None:
        """Store `value` only if the key has none; its revision, or None when the key holds a value."""

    async def update(self, key: str, value: bytes, revision: int) -> int | None:
        """Store `value` only if the key is still at `revision`; the new revision, or None when it moved."""

    async def delete(self, key: str, revision: int | None = None) -> bool:
        """Remove the key's value (only if still at `revision`, when given); False when it had none or moved."""

    async def keys(self) -> list[str]:
        """Every key that holds a value."""


class MemoryPoolStore:
    """Pools in this process only (`--role all`, or SIE_POOL_STORE=memory)."""

    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock
        self._pools: dict[str, Pool] = {}

    async def list(self) -> list[Pool]:
        now = self._clock()
        return [pool for _, pool in sorted(self._pools.items()) if not pool.expired(now)]

    async def get(self, name: str) -> Pool | None:
        pool = self._pools.get(canonical_pool_name(name))
        return None if pool is None or pool.expired(self._clock()) else pool

    async def create(self, pool: Pool) -> Pool:
        if await self.get(pool.name) is not None:
            raise PoolExistsError(f"pool '{pool.name}' already exists")
        self._pools[pool.name] = pool
        return pool

    async def replace(self, pool: Pool) -> Pool:
        written = replacement(self._live(pool.name, self._clock()), pool)
        self._pools[pool.name] = written
        return written

    async def renew(self, name: str, now: float) -> Pool:
        renewed = self._live(canonical_pool_name(name), now).renewed(now)
        self._pools[renewed.name] = renewed
        return renewed

    async def delete(self, name: str) -> bool:
        pool = self._pools.pop(canonical_pool_name(name), None)
        return pool is not None and not pool.expired(self._clock())

    async def sweep(self, now: float) -> int:
        expired = [name for name, pool in self._pools.items() if pool.expired(now)]
        for name in expired:
            del self._pools[name]
        return len(expired)

    def _live(self, name: str, now: float) -> Pool:
        pool = self._pools.get(name)
        if pool is None or pool.expired(now):
            raise PoolNotFoundError(f"pool '{name}' not found")
        return pool


@attrs.frozen
class _Stored:
    """What a key holds: the pool (None when the value is not a pool) and the revision it was read at."""

    pool: Pool | None
    revision: int


class KeyValuePoolStore:
    """Pools as JSON (Pool.to_json) under their names in a KeyValue bucket; every write a compare-and-set."""

    def __init__(self, kv: KeyValue, clock: Clock = time.time) -> None:
        self._kv = kv
        self._clock = clock

    async def list(self) -> list[Pool]:
        now = self._clock()
        pools = []
        for key in sorted(await self._kv.keys()):
            stored = await self._read(key)
            if stored is not None and stored.pool is not None and not stored.pool.expired(now):
                pools.append(stored.pool)
        return pools

    async def get(self, name: str) -> Pool | None:
        stored = await self._read(canonical_pool_name(name))
        if stored is None or stored.pool is None or stored.pool.expired(self._clock()):
            return None
        return stored.pool

    async def create(self, pool: Pool) -> Pool:
        value = self._encode(pool)
        for _ in range(MAX_WRITE_ATTEMPTS):
            if await self._kv.create(pool.name, value) is not None:
                return pool
            stored = await self._read(pool.name)
            if stored is None:
                continue  # deleted since the create was refused
            if stored.pool is not None and not stored.pool.expired(self._clock()):
                raise PoolExistsError(f"pool '{pool.name}' already exists")
            if await self._kv.update(pool.name, value, stored.revision) is not None:
                return pool  # over an expired lease (or a value that is not a pool)
        raise self._conflict("create", pool.name)

    async def replace(self, pool: Pool) -> Pool:
        for _ in range(MAX_WRITE_ATTEMPTS):
            current, revision = await self._live(pool.name, self._clock())
            written = replacement(current, pool)
            if await self._kv.update(pool.name, self._encode(written), revision) is not None:
                return written
        raise self._conflict("replace", pool.name)

    async def renew(self, name: str, now: float) -> Pool:
        name = canonical_pool_name(name)
        for _ in range(MAX_WRITE_ATTEMPTS):
            current, revision = await self._live(name, now)
            renewed = current.renewed(now)
            if renewed is current:
                return current  # renewed at `now` or later already
            if await self._kv.update(name, self._encode(renewed), revision) is not None:
                return renewed
        raise self._conflict("renew", name)

    async def delete(self, name: str) -> bool:
        name = canonical_pool_name(name)
        for _ in range(MAX_WRITE_ATTEMPTS):
            stored = await self._read(name)
            if stored is None:
                return False
            live = stored.pool is not None and not stored.pool.expired(self._clock())
            if await self._kv.delete(name, stored.revision):
                return live
        raise self._conflict("delete", name)

    async def sweep(self, now: float) -> int:
        removed = 0
        for key in await self._kv.keys():
            stored = await self._read(key)
            if stored is None or stored.pool is None or not stored.pool.expired(now):
                continue
            # Only at the revision read: a pool renewed meanwhile stays.
            if await self._kv.delete(key, stored.revision):
                removed += 1
        return removed

    async def _read(self, key: str) -> _Stored | None:
        entry = await self._kv.get(key)
        if entry is None:
            return None
        try:
            pool = Pool.from_json(loads_json(entry.value))
        except (DecodeError, InvalidPoolError) as exc:
            logger.warning("pool store key %r holds no pool (%s); it reads as missing", key, exc)
            return _Stored(None, entry.revision)
        if pool.name != key:
            logger.warning("pool store key %r holds pool %r; it reads as missing", key, pool.name)
            return _Stored(None, entry.revision)
        return _Stored(pool, entry.revision)

    async def _live(self, name: str, now: float) -> tuple[Pool, int]:
        """The pool live at `now` and its revision; PoolNotFoundError when there is none."""
        stored = await self._read(name)
        if stored is None or stored.pool is None or stored.pool.expired(now):
            raise PoolNotFoundError(f"pool '{name}' not found")
        return stored.pool, stored.revision

    def _encode(self, pool: Pool) -> bytes:
        return dumps_json(pool.to_json(self._clock()))

    @staticmethod
    def _conflict(action: str, name: str) -> PoolConflictError:
        return PoolConflictError(
            f"could not {action} pool '{name}': it changed on each of {MAX_WRITE_ATTEMPTS} attempts; try again"
        )
