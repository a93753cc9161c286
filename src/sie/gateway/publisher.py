"""The gateway's side of the work queue: naming requests, admitting them against the lane's state, and
publishing their work items onto a lane subject, with transport failures translated into gateway errors
(seed 000 §2). Pure asyncio; no web framework.

Admission asks two collaborators: whether anything consumes the lane (the worker registry in distributed
mode, the in-process transport in `all`) and how deep the pool's stream is (the transport, which caches what
costs a broker round trip). Nothing here caches on top of them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

from sie.catalog.names import reply_subject
from sie.gateway.errors import ProvisioningError, QueueFullError, QueueUnavailableError
from sie.transport.base import BackpressureError, Lane, NoConsumerError, TransportError, WorkQueue
from sie.wire.queue import WorkItem


class LaneConsumers(Protocol):
    """Whether some worker consumes a lane now (else the gateway answers PROVISIONING)."""

    async def has_consumer(self, lane: Lane) -> bool: ...


class WorkPublisher:
    """Names requests, admits them against the lane's state and publishes their work items."""

    def __init__(self, queue: WorkQueue, consumers: LaneConsumers, max_stream_pending: int, router_id: str) -> None:
        self._queue = queue
        self._consumers = consumers
        self._max_pending = max_stream_pending
        self.router_id = router_id
        self._reply_prefix = reply_subject(router_id, "")
        self._ids = itertools.count(1)

    def new_request(self) -> tuple[str, str]:
        """A fresh `(request_id, reply_subject)`: `{router_id}-{n}` and `_INBOX.{router_id}.{request_id}`."""
        request_id = f"{self.router_id}-{next(self._ids)}"
        return request_id, self._reply_prefix + request_id

    async def admit(self, lane: Lane) -> None:
        """Refuse before publishing: no consumer → PROVISIONING; pool stream over its pending limit → QUEUE_FULL."""
        try:
            served = await self._consumers.has_consumer(lane)
            if not served:
                raise ProvisioningError(
                    f"No worker serves pool '{lane.pool}', machine profile '{lane.machine_profile}', "
                    f"bundle '{lane.bundle}' yet; capacity is being provisioned"
                )
            pending = await self._queue.pending(lane.pool)
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
