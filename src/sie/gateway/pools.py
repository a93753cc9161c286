"""The gateway's pools (seed 000 §2, §16.3): a cached view of the pool store that requests resolve against without
I/O, the protected pools every cluster has (`default` and the deploy-owned static queue pools), the API's writes,
and the background round that keeps the view fresh, sweeps expired leases and records which workers each pool is
assigned.

Every gateway replica reads the same store (a JetStream KV bucket in distributed mode), so they agree on the pools;
assignments are computed from each replica's own worker registry, deterministically (`sie.pools.assign_workers`),
and written back only when they change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final, Self

import attrs

from sie.catalog import Catalog, ModelNotFoundError
from sie.catalog.model import DEFAULT_PROFILE
from sie.gateway.errors import QueueUnavailableError
from sie.gateway.status import WorkerSummary
from sie.pools import (
    DEFAULT_POOL,
    AssignedWorker,
    InvalidPoolError,
    Pool,
    PoolExistsError,
    PoolNotFoundError,
    PoolProtectedError,
    PoolSpec,
    PoolStore,
    assign_workers,
    canonical_pool_name,
    parse_pool_spec,
)
from sie.runtime.periodic import FirstRun, Outage, PeriodicTask
from sie.transport.base import TransportError

logger = logging.getLogger(__name__)

REFRESH_INTERVAL_S: Final = 1.0
# A name the view does not hold is looked up in the store at most this often (a pool another replica just made).
MISS_RECHECK_S: Final = 1.0
MAX_REMEMBERED_MISSES: Final = 1024

# (pool, machine_profile, bundle)
LaneKey = tuple[str, str, str]
Workers = Callable[[], Sequence[WorkerSummary]]


@attrs.frozen
class PoolTarget:
    """Where a request that named a pool goes: the physical queue pool whose lane carries its work, the logical
    pool stamped as the work items' `admission_pool`, and the machine profiles the pool asks for (its demand wakes
    each of them when the request names none)."""

    logical: str
    queue_pool: str
    machine_profiles: tuple[str, ...] = ()


class PoolDirectory:
    """Pools by name, refreshed from `store` every `refresh_interval_s` inside `async with`; `workers` are the workers
    the gateway knows, `catalog` (when given) the models a pool may pin."""

    def __init__(  # noqa: PLR0913 - the store, the deployment's pools, the worker and model views, cadence
        self,
        store: PoolStore,
        static_queue_pools: Sequence[str],
        default_ttl_s: float,
        workers: Workers,
        clock: Callable[[], float] = time.time,
        refresh_interval_s: float = REFRESH_INTERVAL_S,
        catalog: Callable[[], Catalog] | None = None,
    ) -> None:
        self._store = store
        self._catalog = catalog
        self._static = tuple(dict.fromkeys((DEFAULT_POOL, *(canonical_pool_name(p) for p in static_queue_pools))))
        self._default_ttl_s = default_ttl_s
        self._workers = workers
        self._clock = clock
        self._live: dict[str, Pool] = {}
        # Pools this gateway learned (read through, created, renewed) since the current refresh listed the store: a
        # refresh's listing may predate them, and must not take them away again until the next round.
        self._learned: dict[str, Pool] = {}
        self._misses: dict[str, float] = {}
        self._reading: dict[str, asyncio.Future[Pool | None]] = {}
        self._started = clock()
        outage = Outage("refreshing the pools", logger, (TransportError,), meanwhile="keeping the last pools")
        self._refreshing = PeriodicTask(self.refresh, refresh_interval_s, outage, first_run=FirstRun.AT_ENTRY)

    async def __aenter__(self) -> Self:
        await self._refreshing.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._refreshing.__aexit__(*exc_info)

    # Requests

    async def target(self, requested: str) -> PoolTarget | None:
        """The target of a request that named `requested`, None when no such pool lives (the request fails
        closed); InvalidPoolError for a name no pool can have."""
        name = canonical_pool_name(requested)
        if name in self._static:
            return PoolTarget(name, name)
        pool = self._live_pool(name) or await self._read_through(name)
        if pool is None:
            return None
        return PoolTarget(name, pool.spec.queue_pool, tuple(sorted(pool.spec.machine_profiles)))

    def assigned(self, name: str) -> frozenset[str] | None:
        """The worker ids a capped pool may use; None when the pool is uncapped (any worker of its queue pool)."""
        pool = self._live_pool(name)
        if pool is None or not pool.spec.gpu_caps:
            return None
        return frozenset(worker.name for worker in pool.assigned_workers)

    def _live_pool(self, name: str) -> Pool | None:
        pool = self._live.get(name)
        if pool is not None and pool.expired(self._clock()):
            return None
        return pool

    async def _read_through(self, name: str) -> Pool | None:
        """`name` read from the store, one read at a time: requests that arrive while it is read wait for that read
        (never taking it for a miss); a name the store did not have is not read again for MISS_RECHECK_S."""
        reading = self._reading.get(name)
        if reading is None:
            if not self._may_recheck(name):
                return None
            reading = asyncio.ensure_future(self._fetch(name))
            self._reading[name] = reading
            reading.add_done_callback(lambda _: self._reading.pop(name, None))
        return await asyncio.shield(reading)

    async def _fetch(self, name: str) -> Pool | None:
        with _store_failures():
            pool = await self._store.get(name)
        if pool is not None:
            self._learn(pool)
        return pool

    def _learn(self, pool: Pool) -> None:
        """Hold `pool` as live now, through the refresh in progress, and forget that its name was ever missed."""
        self._live[pool.name] = self._learned[pool.name] = pool
        self._misses.pop(pool.name, None)

    def _may_recheck(self, name: str) -> bool:
        now = self._clock()
        last = self._misses.get(name)
        if last is not None and now - last < MISS_RECHECK_S:
            return False
        if len(self._misses) >= MAX_REMEMBERED_MISSES:
            self._misses.clear()
        self._misses[name] = now
        return True

    # The API

    def pools(self) -> list[Pool]:
        """The protected pools, then the live ones by name."""
        now = self._clock()
        live = [pool for _, pool in sorted(self._live.items()) if not pool.expired(now)]
        return [*(self._protected(name) for name in self._static), *live]

    async def get(self, requested: str) -> Pool:
        name = canonical_pool_name(requested)
        if name in self._static:
            return self._protected(name)
        with _store_failures():
            pool = await self._store.get(name)
        if pool is None:
            raise PoolNotFoundError(f"pool '{name}' not found")
        return pool

    async def create(self, body: Mapping[str, object]) -> tuple[Pool, bool]:
        """Create the pool `body` describes, or update the live one of that name (its spec, and a lease renewed
        from now: the public SDK re-POSTs a pool to update it); the pool and whether it is new."""
        spec = parse_pool_spec(body, self._default_ttl_s)
        spec = attrs.evolve(spec, pinned_models=tuple(self._pinned_model(model) for model in spec.pinned_models))
        if spec.name in self._static:
            raise PoolProtectedError(_protected_message(spec.name))
        if spec.queue_pool not in self._static:
            raise InvalidPoolError(
                f"queue_pool '{spec.queue_pool}' is not a queue pool of this cluster; known: {', '.join(self._static)} "
                "(SIE_GATEWAY_STATIC_QUEUE_POOLS declares deploy-owned ones)"
            )
        pool = attrs.evolve(Pool.leased(spec, self._clock()), assigned_workers=self._assignment(spec, ()))
        with _store_failures():
            try:
                stored, new = await self._store.create(pool), True
            except PoolExistsError:
                stored, new = await self._store.replace(pool), False
        self._learn(stored)
        return stored, new

    def _pinned_model(self, model_id: str) -> str:
        """A pinned model as the catalogue names it (`model:default` folds to `model`); InvalidPoolError for a model
        the gateway does not track (seed 000 §16.3)."""
        if self._catalog is None:
            return model_id
        base, _, profile = model_id.rpartition(":")
        if base and profile == DEFAULT_PROFILE:
            model_id = base
        try:
            entry = self._catalog().get(model_id)
        except ModelNotFoundError:
            raise InvalidPoolError(f"pinned model '{model_id}' is not a model this gateway tracks") from None
        return entry.model_id

    async def renew(self, requested: str) -> Pool:
        name = canonical_pool_name(requested)
        if name in self._static:
            return self._protected(name)
        with _store_failures():
            pool = await self._store.renew(name, self._clock())
        self._learn(pool)
        return pool

    async def delete(self, requested: str) -> None:
        name = canonical_pool_name(requested)
        if name in self._static:
            raise PoolProtectedError(_protected_message(name))
        with _store_failures():
            deleted = await self._store.delete(name)
        self._live.pop(name, None)
        self._learned.pop(name, None)
        if not deleted:
            raise PoolNotFoundError(f"pool '{name}' not found")

    def machine_profiles(self) -> frozenset[str]:
        """The machine profiles the live pools ask for: capacity can come for them (a request for one waits)."""
        now = self._clock()
        return frozenset(
            profile for pool in self._live.values() if not pool.expired(now) for profile in pool.spec.machine_profiles
        )

    # Scale signals

    def warm_floors(self) -> dict[LaneKey, int]:
        """Per lane, the largest `minimum_worker_count` of the pools that can name it (seed 000 §16.3: the maximum
        over logical pools sharing a lane, not the sum)."""
        floors: dict[LaneKey, int] = {}
        now = self._clock()
        for pool in self._live.values():
            spec = pool.spec
            if spec.minimum_worker_count <= 0 or pool.expired(now):
                continue
            for lane in self._lanes_of(spec):
                floors[lane] = max(floors.get(lane, 0), spec.minimum_worker_count)
        return floors

    def pinning_pools(self) -> dict[str, list[str]]:
        """Per model id, the live pools that pin it (`pinned_models`), by name."""
        now = self._clock()
        pinning: dict[str, list[str]] = {}
        for pool in sorted(self._live.values(), key=lambda pool: pool.name):
            if not pool.expired(now):
                for model in pool.spec.pinned_models:
                    pinning.setdefault(model, []).append(pool.name)
        return pinning

    def pinned_models_loaded(self) -> dict[tuple[str, str], int]:
        """Per (pool, pinned model): 1 when a healthy worker assigned to the pool has the model loaded, else 0."""
        loaded_by = {worker.name: set(worker.loaded_models) for worker in self._workers() if worker.healthy}
        now = self._clock()
        values: dict[tuple[str, str], int] = {}
        for pool in self._live.values():
            if pool.expired(now):
                continue
            assigned = [loaded_by.get(worker.name, set()) for worker in pool.assigned_workers]
            for model in pool.spec.pinned_models:
                values[(pool.name, model)] = int(any(model in loaded for loaded in assigned))
        return values

    def _lanes_of(self, spec: PoolSpec) -> list[LaneKey]:
        """The lanes a pool can name: its queue pool × its machine profiles × its bundle, or every bundle a worker
        of that queue pool and profile announced (a pool without a bundle spans them)."""
        profiles = sorted(spec.machine_profiles)
        if spec.bundle is not None:
            return [(spec.queue_pool, profile, spec.bundle) for profile in profiles]
        bundles = sorted({w.bundle for w in self._workers() if w.pool == spec.queue_pool}) or ["default"]
        return [(spec.queue_pool, profile, bundle) for profile in profiles for bundle in bundles]

    # The background round

    async def refresh(self) -> None:
        """Read every live pool, sweep expired leases, and write back assignments that changed. A pool learned while
        this ran and missing from its listing (which may predate it) stays live until the next round."""
        now = self._clock()
        self._learned = {}
        await self._store.sweep(now)
        live = {pool.name: pool for pool in await self._store.list()}
        for name, pool in list(live.items()):
            assigned = self._assignment(pool.spec, pool.assigned_workers)
            if assigned == pool.assigned_workers:
                continue
            try:
                live[name] = await self._store.replace(attrs.evolve(pool, assigned_workers=assigned))
            except PoolNotFoundError:
                live.pop(name, None)
        for name, pool in self._learned.items():
            live.setdefault(name, pool)
        self._live = live

    def _assignment(self, spec: PoolSpec, previous: Sequence[AssignedWorker]) -> tuple[AssignedWorker, ...]:
        return assign_workers(spec, self._candidates(spec.queue_pool), tuple(previous))

    def _candidates(self, queue_pool: str) -> list[AssignedWorker]:
        """The healthy workers on `queue_pool`, as assignment candidates."""
        return [
            AssignedWorker(
                name=worker.name,
                machine_profile=worker.machine_profile.lower(),
                bundle=worker.bundle,
                gpus=max(1, worker.gpu_count),
            )
            for worker in self._workers()
            if worker.healthy and worker.pool == queue_pool
        ]

    def _protected(self, name: str) -> Pool:
        """`default` or a static queue pool: no requirements, no lease, every healthy worker of that queue pool."""
        pool = Pool.protected_queue_pool(name, self._started)
        return attrs.evolve(pool, assigned_workers=tuple(self._candidates(name)))


@contextlib.contextmanager
def _store_failures() -> Iterator[None]:
    """A pool store the broker cannot reach is a retryable 503 for the caller, as a work publish would be."""
    try:
        yield
    except TransportError as exc:
        raise QueueUnavailableError(f"The pool store is unavailable: {exc}") from exc


def _protected_message(name: str) -> str:
    return f"pool '{name}' is protected: the default pool and the static queue pools belong to the deployment"
