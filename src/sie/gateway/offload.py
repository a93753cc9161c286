"""Payload offload on the gateway (seed 000 §16.2, contracts Part B §4.1): a work item whose encoded payload is
over the inline limit is written to the payload store under its exact key and published with `payload_ref` (score:
`query_payload_ref`) instead; the keys are deleted once nobody waits for the request any more. A generation's prompt
(or chat messages) is its payload (`sie.wire.offload`).

Without a store nothing is offloaded: an item that fits the broker's max_payload still goes inline, one that does
not is refused with 413 PAYLOAD_TOO_LARGE naming SIE_PAYLOAD_STORE_URL. A transport without a message limit
(the loopback of `--role all`) never offloads. Deletes are detached and bounded: past the bound a key is left
behind (logged), as a store lifecycle rule would reclaim it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Final

from sie.gateway.errors import PayloadTooLargeError, QueueUnavailableError
from sie.runtime.periodic import Outage, PeriodicTask
from sie.stores.payload_store import PayloadStore, PayloadStoreError
from sie.telemetry.gateway import OffloadOutcome, StoreMetrics
from sie.wire.offload import inline_payload, offloaded, packed_payload, payload_key
from sie.wire.queue import OPERATION_GENERATE, OPERATION_SCORE, WorkItem

logger = logging.getLogger(__name__)

DEFAULT_INLINE_LIMIT_BYTES: Final = 2**20
# Room left in a broker message for the rest of a work item (ids, options, schema) beside its payload.
WORK_ITEM_HEADROOM_BYTES: Final = 16 * 1024
# Deletions in flight at once; beyond it a key is left behind (best effort, like work_cancel).
MAX_PENDING_DELETES: Final = 1024
# What msgpack adds around one value at most (a str32/bin32/map32 header), for the upper bound below.
_HEADER_BYTES: Final = 5
STORE_SETTING: Final = "SIE_PAYLOAD_STORE_URL"

MaxPayload = Callable[[], int | None]
# Registers a hook to run once nobody waits for the request any more (PendingRequest.at_close).
OnClose = Callable[[Callable[[], None]], None]


def size_bound(value: Any) -> int:
    """An upper bound of `value`'s msgpack size, computed without packing it (a str is at most 4 bytes per
    character in UTF-8). Items far under the limit are never packed twice."""
    if isinstance(value, str):
        return 4 * len(value) + _HEADER_BYTES
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value) + _HEADER_BYTES
    if isinstance(value, dict):
        return _HEADER_BYTES + sum(size_bound(key) + size_bound(entry) for key, entry in value.items())
    if isinstance(value, list | tuple):
        return _HEADER_BYTES + sum(size_bound(entry) for entry in value)
    return 9  # numbers, booleans, nil


def _what(item: WorkItem) -> str:
    if item.operation == OPERATION_SCORE:
        return "The score request's query and items"
    if item.operation == OPERATION_GENERATE:
        return "The prompt"
    return f"Item {item.item_index}"


class PayloadOffload:
    """Decides per work item whether its payload travels inline or through `store`, and cleans up after."""

    def __init__(
        self,
        store: PayloadStore | None,
        max_payload: MaxPayload,
        inline_limit_bytes: int = DEFAULT_INLINE_LIMIT_BYTES,
        metrics: StoreMetrics | None = None,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._max_payload = max_payload
        self._inline_limit = inline_limit_bytes
        self._deletes: set[asyncio.Task[None]] = set()

    def limit(self) -> int | None:
        """The payload size above which an item is offloaded (or, without a store, refused); None: no limit."""
        broker = self._max_payload()
        if broker is None:
            return None
        fits = broker - WORK_ITEM_HEADROOM_BYTES
        return min(self._inline_limit, fits) if self._store is not None else fits

    async def prepare(self, items: Sequence[WorkItem], on_close: OnClose) -> list[WorkItem]:
        """`items` as they are published: each payload over the limit stored and replaced by its key. `on_close`
        registers the deletion of those keys for when the request ends (registered before writing, so a write
        that fails or is cancelled half-way is cleaned up too). PayloadTooLargeError without a store,
        QueueUnavailableError when the store fails."""
        limit = self.limit()
        if limit is None:
            return list(items)
        moved: dict[int, bytes] = {}
        for position, item in enumerate(items):
            if size_bound(inline_payload(item)) <= limit:
                continue
            data = packed_payload(item)
            if len(data) > limit:
                moved[position] = data
        if not moved:
            return list(items)
        if self._store is None:
            position = next(iter(moved))
            self._count(OffloadOutcome.REFUSED, len(moved))
            raise PayloadTooLargeError(
                f"{_what(items[position])} is {len(moved[position])} bytes encoded, more than the {limit} bytes a "
                f"work item may carry on the broker; set {STORE_SETTING} to offload large items"
            )
        keys = {position: payload_key(items[position]) for position in moved}
        on_close(lambda: self.discard(list(keys.values())))
        await self._write(self._store, [(keys[position], data) for position, data in moved.items()])
        self._count(OffloadOutcome.STORED, len(moved))
        return [offloaded(item, keys[position]) if position in keys else item for position, item in enumerate(items)]

    def discard(self, keys: list[str]) -> None:
        """Delete `keys` in the background (detached, bounded); never delays the request that ends."""
        if self._store is None or not keys:
            return
        if len(self._deletes) >= MAX_PENDING_DELETES:
            logger.warning("payload cleanup is saturated; leaving %d offloaded payloads behind", len(keys))
            self._count(OffloadOutcome.DELETE_FAILED, len(keys))
            return
        task = asyncio.get_running_loop().create_task(self._delete(self._store, keys))
        self._deletes.add(task)
        task.add_done_callback(self._deletes.discard)

    async def sweep(self, older_than_s: float) -> None:
        """Delete the store's payloads older than `older_than_s` (a crashed gateway's: no request end deletes them);
        PayloadStoreError when the store fails (the periodic sweep reports it and tries again)."""
        if self._store is None:
            return
        swept = await self._store.sweep(older_than_s)
        if swept:
            logger.info("swept %d payloads older than %.0f s from the payload store", swept, older_than_s)
        self._count(OffloadOutcome.SWEPT, swept)

    def sweeping(self, older_than_s: float) -> PeriodicTask:
        """A task (`async with`) sweeping payloads older than `older_than_s` every tenth of it; a failing store is
        reported once and tried again."""
        outage = Outage("the payload store sweep", logger, (PayloadStoreError,), meanwhile="trying again later")
        return PeriodicTask(lambda: self.sweep(older_than_s), older_than_s / 10, outage)

    async def aclose(self) -> None:
        """Wait for the deletions still running (the role's shutdown)."""
        await asyncio.gather(*self._deletes, return_exceptions=True)

    async def _write(self, store: PayloadStore, entries: list[tuple[str, bytes]]) -> None:
        outcomes = await asyncio.gather(*(store.put(key, data) for key, data in entries), return_exceptions=True)
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if not failures:
            return
        self._count(OffloadOutcome.STORE_FAILED, len(entries))
        error = failures[0]
        if not isinstance(error, PayloadStoreError):
            raise error
        raise QueueUnavailableError(f"The payload store is unavailable: {error}") from error

    async def _delete(self, store: PayloadStore, keys: list[str]) -> None:
        outcomes = await asyncio.gather(*(store.delete(key) for key in keys), return_exceptions=True)
        for key, outcome in zip(keys, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                logger.warning("deleting offloaded payload %s failed: %s", key, outcome)
        failed = sum(1 for outcome in outcomes if isinstance(outcome, BaseException))
        self._count(OffloadOutcome.DELETE_FAILED, failed)
        self._count(OffloadOutcome.DELETED, len(keys) - failed)

    def _count(self, outcome: OffloadOutcome, count: int) -> None:
        if self._metrics is not None and count:
            self._metrics.offload(outcome, count)
