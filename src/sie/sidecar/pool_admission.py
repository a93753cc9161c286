"""The sidecar's pool admission gate (seed 000 §16.3, seed 001 "Pool Admission"): which logical pools assign this
worker, learnt by polling the gateway's `GET /v1/pools` every SIE_POOL_POLL_INTERVAL_S, and which deliveries the
consumer therefore NAKs for another worker of the lane before any backend IPC for them.

Rules, per work item: no `admission_pool`, or the lane's own queue pool, is admitted as without the gate; a logical
pool the last good poll lists, backed by this lane's queue pool, is admitted when it is uncapped (no `gpu_caps`)
or lists this worker among its `assigned_workers`; anything else is refused, including a pool the gateway does
not list (fail closed). While the gateway is unreachable or answers an error the last good view stays; before a
first good one only the lane's own pool is admitted, so the default pool keeps flowing. It reads only the fields
it needs from the gateway's pool JSON and never imports the gateway.

The same view says which models this worker must keep loaded: the `pinned_models` of every pool of this lane's
queue pool that it serves (capped pools that assign it, uncapped ones); each good poll hands that set to the
callback `keep_pinned_with` names (the sidecar's `PinnedModels`).
"""

from __future__ import annotations

import collections
import enum
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

import attrs
import httpx

from sie.runtime.periodic import FirstRun, Outage, PeriodicTask
from sie.settings import Settings
from sie.sidecar.work import Work
from sie.telemetry.sidecar import Admission as Decision
from sie.telemetry.sidecar import SidecarMetrics

logger = logging.getLogger(__name__)

POOLS_PATH: Final = "/v1/pools"
# Bounds one poll; the consumer never waits for a poll (it reads the last good view), only the first one does.
POLL_TIMEOUT_S: Final = 5.0
# What a poll that got no usable answer raises (besides PoolStatusError): the gateway away, or a body that is no view.
POLL_FAILURES: Final = (httpx.HTTPError, ValueError)


class PoolStatusError(Exception):
    """The gateway's answer to `GET /v1/pools` is unusable (the last good view stays)."""


@attrs.frozen
class PoolView:
    """What the gate needs of one pool: its backing queue pool, whether it is capped, the workers it assigns."""

    name: str
    queue_pool: str
    capped: bool
    assigned: frozenset[str]
    pinned: tuple[str, ...] = ()


def _canonical(name: str) -> str:
    return name.strip().lower()


def _pool_view(entry: object) -> PoolView | None:
    """One pool entry; None when it lacks a usable name, queue pool, caps or assignments."""
    spec = entry.get("spec") if isinstance(entry, dict) else None
    if not isinstance(spec, dict):
        return None
    status = entry.get("status") if isinstance(entry.get("status"), dict) else {}
    name, queue_pool = spec.get("name"), spec.get("queue_pool") or "default"
    caps, workers = spec.get("gpu_caps") or {}, status.get("assigned_workers") or []
    pinned = spec.get("pinned_models") or []
    if not isinstance(name, str) or not name.strip() or not isinstance(queue_pool, str):
        return None
    if not isinstance(caps, dict) or not isinstance(workers, list) or not isinstance(pinned, list):
        return None
    assigned = frozenset(w["name"] for w in workers if isinstance(w, dict) and isinstance(w.get("name"), str))
    models = tuple(model for model in pinned if isinstance(model, str) and model)
    return PoolView(_canonical(name), _canonical(queue_pool), bool(caps), assigned, models)


def parse_pools(document: object) -> dict[str, PoolView]:
    """The pools of a `GET /v1/pools` answer (`{"pools": [Pool JSON, ...]}`) by canonical name. Unknown fields are
    ignored; an entry without a usable spec is left out (so its work is refused: fail closed); a document of
    another shape raises PoolStatusError."""
    entries = document.get("pools") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise PoolStatusError("expected a JSON object with a 'pools' list")
    views = [_pool_view(entry) for entry in entries]
    if None in views:
        logger.warning("pool admission: %d unusable pool entries left out", views.count(None))
    return {view.name: view for view in views if view is not None}


class Refusal(enum.StrEnum):
    """Why the gate refused a work item."""

    NO_VIEW = "no_view"  # a logical pool, and the gateway has not answered a poll yet
    UNKNOWN_POOL = "unknown_pool"  # the last good poll does not list the pool (expired, deleted, never created)
    OTHER_QUEUE = "other_queue"  # the pool is backed by another queue pool than this lane's
    NOT_ASSIGNED = "not_assigned"  # a capped pool whose assigned_workers do not name this worker


def refusal(
    admission_pool: str | None, lane_pool: str, worker_id: str, pools: Mapping[str, PoolView] | None
) -> Refusal | None:
    """Why a work item with `admission_pool` may not run on worker `worker_id` of queue pool `lane_pool`, given the
    last good view of the pools (None: none yet); None when it may."""
    wanted = _canonical(admission_pool or "")
    if not wanted or wanted == _canonical(lane_pool):
        return None
    if pools is None:
        return Refusal.NO_VIEW
    pool = pools.get(wanted)
    if pool is None:
        return Refusal.UNKNOWN_POOL
    if pool.queue_pool != _canonical(lane_pool):
        return Refusal.OTHER_QUEUE
    if pool.capped and worker_id not in pool.assigned:
        return Refusal.NOT_ASSIGNED
    return None


def pinned_models(pools: Mapping[str, PoolView], lane_pool: str, worker_id: str) -> frozenset[str]:
    """The models worker `worker_id` of queue pool `lane_pool` keeps loaded: those pinned by the pools whose work it
    serves (backed by its queue pool; uncapped, or capped and assigning it)."""
    lane = _canonical(lane_pool)
    return frozenset(
        model
        for pool in pools.values()
        if pool.queue_pool == lane and (not pool.capped or worker_id in pool.assigned)
        for model in pool.pinned
    )


@attrs.frozen
class GatewayPools:
    """Where the pool view comes from: a gateway's base URL, the bearer it takes, how often it is asked."""

    url: str
    token: str | None = None
    interval_s: float = 10.0


class PoolGate:
    """The gate of one sidecar: an async context manager that polls the gateway (the first poll before it returns,
    so the consumer's first fetch is judged against a real view) and `split`s deliveries into admitted and refused.
    `refused` counts refusals by (pool, reason); `polls` and `failures` count the gateway's answers."""

    def __init__(
        self, source: GatewayPools, lane_pool: str, worker_id: str, metrics: SidecarMetrics | None = None
    ) -> None:
        self.source = source
        self.lane_pool = lane_pool
        self.worker_id = worker_id
        self._metrics = metrics
        self.pools: dict[str, PoolView] | None = None  # the last good view; None until the gateway answered
        self.refused: collections.Counter[tuple[str, Refusal]] = collections.Counter()
        self.polls = 0
        self.failures = 0
        self._http: httpx.AsyncClient | None = None
        self._keep_pinned: Callable[[frozenset[str]], Awaitable[None]] | None = None
        outage = Outage(
            f"pool admission: GET {source.url}{POOLS_PATH}",
            logger,
            (PoolStatusError, *POLL_FAILURES),
            meanwhile="keeping the last good view (before one, admitting only this lane's own pool)",
        )
        self._polling = PeriodicTask(self.poll_once, source.interval_s, outage, first_run=FirstRun.AT_ENTRY)

    @classmethod
    def from_settings(cls, settings: Settings, metrics: SidecarMetrics | None = None) -> PoolGate | None:
        """The gate of the lane SIE_POOL and worker SIE_WORKER_ID; None without SIE_GATEWAY_URL (no gate)."""
        sidecar = settings.sidecar
        if not sidecar.gateway_url:
            return None
        source = GatewayPools(sidecar.gateway_url, sidecar.gateway_token, sidecar.pool_poll_interval_s)
        return cls(source, settings.lane.pool, settings.process.worker_id, metrics)

    def keep_pinned_with(self, keep: Callable[[frozenset[str]], Awaitable[None]]) -> None:
        """After each good poll, `await keep(models this worker must keep loaded)` (set before `async with`)."""
        self._keep_pinned = keep

    async def __aenter__(self) -> PoolGate:
        headers = {"Authorization": f"Bearer {self.source.token}"} if self.source.token else {}
        self._http = httpx.AsyncClient(base_url=self.source.url.rstrip("/"), headers=headers, timeout=POLL_TIMEOUT_S)
        await self._polling.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._polling.__aexit__(*exc_info)
        if self._http is not None:
            await self._http.aclose()

    async def poll_once(self) -> None:
        """Ask the gateway once and take its answer as the view; a failure keeps the last good one and raises."""
        if self._http is None:
            raise RuntimeError("PoolGate.poll_once outside `async with`: this is a bug")
        try:
            response = await self._http.get(POOLS_PATH)
            if response.status_code != httpx.codes.OK:
                raise PoolStatusError(f"HTTP {response.status_code}")
            pools = parse_pools(response.json())
        except (*POLL_FAILURES, PoolStatusError):
            self.failures += 1
            raise
        self.pools, self.polls = pools, self.polls + 1
        if self._keep_pinned is not None:
            await self._keep_pinned(pinned_models(pools, self.lane_pool, self.worker_id))

    def split(self, works: list[Work]) -> tuple[list[Work], list[Work]]:
        """(admitted, refused) under the current view; refusals are counted and logged per pool and reason."""
        admitted: list[Work] = []
        refused: list[Work] = []
        reasons: collections.Counter[tuple[str, Refusal]] = collections.Counter()
        for work in works:
            reason = refusal(work.item.admission_pool, self.lane_pool, self.worker_id, self.pools)
            if reason is None:
                admitted.append(work)
            else:
                refused.append(work)
                reasons[(_canonical(work.item.admission_pool or ""), reason)] += 1
        for (pool, reason), count in reasons.items():
            logger.info("pool admission: NAKing %d items of pool %r on worker %s: %s", count, pool, self.worker_id,
                        reason.value)  # fmt: skip
        self.refused.update(reasons)
        if self._metrics is not None:
            self._metrics.admission(Decision.POOL_REFUSED, len(refused))
        return admitted, refused
