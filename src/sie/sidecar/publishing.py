"""How one item's result reaches the gateway (seed 001 "Preparation And Framing"): as one WorkResult when it fits
the broker's max_payload; as ordered result_chunk_v1 envelopes when it does not and the work item says the gateway
reassembles them (`accepts_result_chunks`); otherwise, or past the v1 bounds, as a compact PAYLOAD_TOO_LARGE
result, so the item is answered and ACKed instead of failing to publish and being redelivered until its
deliveries run out. Flushing before the ACK stays the settler's job. A bus without a limit (the loopback of
`--role all`, where results pass by reference) publishes every result as it is, and so does a reply subject that
never reaches the broker (local ingest: its socket bounds the result instead).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from sie.sidecar.results import payload_too_large_result
from sie.telemetry.sidecar import ResultTransport, SidecarMetrics
from sie.transport.base import MessageBus
from sie.wire import to_msgpack
from sie.wire.queue import WorkItem, WorkResult
from sie.wire.result_chunks import chunk_bytes_for, refusal, split, transfer_digest

logger = logging.getLogger(__name__)

# A result whose estimated size is under this share of the limit is published without measuring it exactly.
_ESTIMATE_SAFETY: Final = 2
# Room for the WorkResult fields around its body (ids, timings, units, hashes).
_FIELDS_BYTES: Final = 2048

MaxPayload = Callable[[], int | None]
Unbounded = Callable[[str], bool]


def _no_limit() -> None:
    return None


def estimated_size(result: WorkResult) -> int:
    """About how many bytes `result` takes as msgpack, without packing it (exact for a body that arrived packed)."""
    body = result.result_msgpack.size_hint() if result.result_msgpack is not None else 0
    return body + 4 * len(result.error or "") + _FIELDS_BYTES


class ResultPublisher:
    """Publishes each item's result on its reply subject within the broker's message limit; `chunked` and
    `too_large` count the results that needed it, and `metrics` (when given) every result by how it travelled.
    `unbounded` says which reply subjects never cross the broker (their results go whole, and are not counted)."""

    def __init__(
        self,
        bus: MessageBus,
        max_payload: MaxPayload = _no_limit,
        metrics: SidecarMetrics | None = None,
        unbounded: Unbounded | None = None,
    ) -> None:
        self._bus = bus
        self._max_payload = max_payload
        self._metrics = metrics
        self._unbounded = unbounded
        self.chunked = 0
        self.too_large = 0

    async def publish(self, item: WorkItem, result: WorkResult) -> None:
        """Send `result` for `item`; raises what the bus raises (the settler leaves the delivery unsettled)."""
        if self._unbounded is not None and self._unbounded(item.reply_subject):
            await self._bus.publish_result(item.reply_subject, result)
            return
        limit = self._max_payload()
        if limit is None or estimated_size(result) * _ESTIMATE_SAFETY <= limit:
            await self._bus.publish_result(item.reply_subject, result)
            self._count(ResultTransport.WHOLE)
            return
        payload = to_msgpack(result)
        if len(payload) <= limit:
            await self._bus.publish_result(item.reply_subject, result)
            self._count(ResultTransport.WHOLE)
            return
        await self._publish_large(item, result, payload, limit)

    def _count(self, transport: ResultTransport) -> None:
        if self._metrics is not None:
            self._metrics.result(transport)

    async def _publish_large(self, item: WorkItem, result: WorkResult, payload: bytes, limit: int) -> None:
        chunk_bytes = chunk_bytes_for(result, limit)
        reason = refusal(len(payload), chunk_bytes)
        if not item.accepts_result_chunks or reason is not None:
            why = reason or "the gateway does not accept result chunks"
            logger.warning("result of %s is %d bytes, over the broker's %d: %s; answering PAYLOAD_TOO_LARGE",
                           item.work_item_id, len(payload), limit, why)  # fmt: skip
            self.too_large += 1
            self._count(ResultTransport.TOO_LARGE)
            await self._bus.publish_result(item.reply_subject, payload_too_large_result(result, len(payload), limit))
            return
        digest = await asyncio.to_thread(transfer_digest, payload)  # up to 16 MiB: off the event loop
        for chunk in split(result, payload, digest, chunk_bytes):
            await self._bus.publish_result(item.reply_subject, chunk)
        self.chunked += 1
        self._count(ResultTransport.CHUNKED)
