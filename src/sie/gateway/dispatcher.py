"""Admission and publishing: request ids, the cached no-consumer and backpressure checks, and the publish of
work items onto a lane subject, with transport failures translated into gateway errors (seed 000 §2).

Admission reads cached transport state (refreshed at most every ADMISSION_TTL_S, one refresh in flight per
key), so a burst of requests costs no broker round-trips. Pure asyncio; no web framework.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Final, Generic, TypeVar

from sie.catalog.names import reply_subject
from sie.gateway.errors import ProvisioningError, QueueFullError, QueueUnavailableError
from sie.settings import GatewaySettings
from sie.transport.base import BackpressureError, Lane, NoConsumerError, TransportError, WorkQueue
from sie.wire.queue import WorkItem

ADMISSION_TTL_S: Final = 0.05
_MAX_CACHED_KEYS: Final = 1024

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class RefreshingCache(Generic[K, V]):
    """Values fetched on demand and reused for `ttl_s`; concurrent misses share one fetch."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._values: dict[K, tuple[V, float]] = {}
        self._inflight: dict[K, asyncio.Task[V]] = {}

    async def get(self, key: K, fetch: Callable[[K], Awaitable[V]]) -> V:
        hit = self._values.get(key)
        if hit is not None and self._clock() < hit[1]:
            return hit[0]
        task = self._inflight.get(key)
        if task is None:
            task = self._inflight[key] = asyncio.ensure_future(self._refresh(key, fetch))
        # Shielded: a caller that goes away must not cancel the fetch the others wait for.
        return await asyncio.shield(task)

    async def _refresh(self, key: K, fetch: Callable[[K], Awaitable[V]]) -> V:
        try:
            value = await fetch(key)
        finally:
            del self._inflight[key]
        if len(self._values) >= _MAX_CACHED_KEYS:
            self._values.clear()
        self._values[key] = (value, self._clock() + self._ttl_s)
        return value


class Dispatcher:
    """Names requests, admits them against the lane's state and publishes their work items."""

    def __init__(self, queue: WorkQueue, settings: GatewaySettings, router_id: str) -> None:
        self._queue = queue
        self._max_pending = settings.max_stream_pending
        self._router_id = router_id
        self._reply_prefix = reply_subject(router_id, "")
        self._ids = itertools.count(1)
        self._consumers: RefreshingCache[Lane, bool] = RefreshingCache(ADMISSION_TTL_S)
        self._pending: RefreshingCache[str, int] = RefreshingCache(ADMISSION_TTL_S)

    @property
    def router_id(self) -> str:
        return self._router_id

    def new_request(self) -> tuple[str, str]:
        """A fresh `(request_id, reply_subject)`: `{router_id}-{n}` and `_INBOX.{router_id}.{request_id}`."""
        request_id = f"{self._router_id}-{next(self._ids)}"
        return request_id, self._reply_prefix + request_id

    async def admit(self, lane: Lane) -> None:
        """Refuse before publishing: no consumer → PROVISIONING; pool stream over its pending limit → QUEUE_FULL."""
        try:
            served = await self._consumers.get(lane, self._queue.has_consumer)
            if not served:
                raise ProvisioningError(
                    f"No worker serves pool '{lane.pool}', machine profile '{lane.machine_profile}', "
                    f"bundle '{lane.bundle}' yet; capacity is being provisioned"
                )
            pending = await self._pending.get(lane.pool, self._queue.pending)
        except TransportError as exc:
            raise QueueUnavailableError(f"The work queue is unavailable: {exc}") from exc
        if pending > self._max_pending:
            raise QueueFullError(f"Pool '{lane.pool}' has {pending} pending work items; retry later")

    async def publish(self, subject: str, items: Sequence[WorkItem]) -> None:
        """Queue every item on `subject`, in order; the first refusal ends the request."""
        try:
            await self._queue.publish_work_batch(subject, items)
        except BackpressureError as exc:
            raise QueueFullError(f"The work queue is full: {exc}") from exc
        except NoConsumerError as exc:
            raise ProvisioningError(f"No worker consumes {subject} yet; capacity is being provisioned") from exc
        except TransportError as exc:
            raise QueueUnavailableError(f"The work queue is unavailable: {exc}") from exc
