"""Pools and capacity isolation (seed 000 §16.3): pool specs and their validation, leased pools and their JSON
shape, deterministic worker assignment, the pool stores (memory, any key-value bucket with revisions) and the
pending-demand tracker behind scale-from-zero.

Pure logic plus stores behind small protocols: imports only catalog, wire, settings, the standard library and
attrs; never a broker client or a web framework (the NATS KV adapter lives in sie.transport.nats.kv).
"""

from sie.pools.assignment import assign_workers
from sie.pools.demand import DEFAULT_MAX_LANES, DemandTracker, LaneKey
from sie.pools.pool import AssignedWorker, Pool, PoolState, replacement
from sie.pools.spec import (
    DEFAULT_POOL,
    InvalidPoolError,
    PoolConflictError,
    PoolError,
    PoolExistsError,
    PoolNotFoundError,
    PoolProtectedError,
    PoolSpec,
    canonical_pool_name,
    parse_pool_spec,
)
from sie.pools.store import KeyValue, KeyValueEntry, KeyValuePoolStore, MemoryPoolStore, PoolStore

__all__ = [
    "DEFAULT_MAX_LANES",
    "DEFAULT_POOL",
    "AssignedWorker",
    "DemandTracker",
    "InvalidPoolError",
    "KeyValue",
    "KeyValueEntry",
    "KeyValuePoolStore",
    "LaneKey",
    "MemoryPoolStore",
    "Pool",
    "PoolConflictError",
    "PoolError",
    "PoolExistsError",
    "PoolNotFoundError",
    "PoolProtectedError",
    "PoolSpec",
    "PoolState",
    "PoolStore",
    "assign_workers",
    "canonical_pool_name",
    "parse_pool_spec",
    "replacement",
]
