"""Offloaded payloads on the sidecar (seed 001 "Preparation And Framing", "non-generation abandonment"): a work
item that names its payload by `payload_ref` (score: `query_payload_ref`) gets it back from the payload store,
read with a size bound, before it is prepared. Tombstones and deadlines are asked before the fetch (by the
preparation stage) and again after it, so abandoned work is neither fetched nor prepared. A fetch that fails
answers its item with a classified error and ACKs it: never a crash, never a redelivery loop. The store's keys
are the gateway's to delete.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from sie.sidecar.results import error_result
from sie.sidecar.work import Work
from sie.stores.payload_store import PayloadNotFoundError, PayloadOverLimitError, PayloadStore, PayloadStoreError
from sie.telemetry.sidecar import FetchOutcome, SidecarMetrics
from sie.wire import DecodeError, codes
from sie.wire.offload import payload_ref, restored
from sie.wire.queue import WorkResult

logger = logging.getLogger(__name__)

DEFAULT_FETCH_MAX_BYTES: Final = 272 * 2**20
STORE_SETTING: Final = "SIE_PAYLOAD_STORE_URL"

Live = Callable[[list[Work]], Awaitable[list[Work]]]
Reply = Callable[[Sequence[tuple[Work, WorkResult]]], Awaitable[None]]


class PayloadResolver:
    """Puts offloaded payloads back into their work items; failures are answered through `reply`, abandoned
    work is ACK-dropped through `live`."""

    def __init__(
        self,
        store: PayloadStore | None,
        live: Live,
        reply: Reply,
        worker_id: str,
        max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
        metrics: SidecarMetrics | None = None,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._live = live
        self._reply = reply
        self._worker_id = worker_id
        self._max_bytes = max_bytes
        self.fetched = 0

    async def resolve(self, works: list[Work]) -> list[Work]:
        """`works` with every offloaded payload inlined; the ones that failed are answered, the ones nobody waits
        for any more are dropped, and neither is returned."""
        offloaded = [work for work in works if payload_ref(work.item) is not None]
        if not offloaded:
            return works
        failures = await asyncio.gather(*(self.inline(work) for work in offloaded))
        failed = [
            (work, error_result(work.item, *failure, self._worker_id))
            for work, failure in zip(offloaded, failures, strict=True)
            if failure is not None
        ]
        if failed:
            await self._reply(failed)
            answered = {id(work) for work, _ in failed}
            works = [work for work in works if id(work) not in answered]
        return await self._live(works)  # a cancel may have come while the payloads were read

    async def inline(self, work: Work) -> tuple[str, str] | None:
        """Put the work's offloaded payload back into its item; the error code and message to answer it with when
        that fails."""
        item = work.item
        key = payload_ref(item) or ""
        if self._store is None:
            reason = f"the item's payload was offloaded, but this worker has no {STORE_SETTING}"
            return self._failure(FetchOutcome.NO_STORE, codes.INTERNAL_ERROR, reason)
        try:
            data = await self._store.get(key, self._max_bytes)
            work.item = restored(item, data)
        except PayloadOverLimitError:
            return self._failure(FetchOutcome.OVER_LIMIT, codes.PAYLOAD_TOO_LARGE,
                                 f"the offloaded payload is over the {self._max_bytes}-byte fetch limit")  # fmt: skip
        except PayloadNotFoundError:
            return self._failure(FetchOutcome.MISSING, codes.INTERNAL_ERROR,
                                 "the offloaded payload is gone from the payload store")  # fmt: skip
        except PayloadStoreError as exc:
            logger.warning("fetching the payload of %s failed: %s", item.work_item_id, exc)
            return self._failure(FetchOutcome.STORE_ERROR, codes.INTERNAL_ERROR, "the payload store could not be read")
        except DecodeError as exc:
            logger.warning("the payload of %s is malformed: %s", item.work_item_id, exc)
            return self._failure(FetchOutcome.MALFORMED, codes.INTERNAL_ERROR, "the offloaded payload is malformed")
        self.fetched += 1
        if self._metrics is not None:
            self._metrics.payload_fetch(FetchOutcome.FETCHED)
        return None

    def _failure(self, outcome: FetchOutcome, code: str, message: str) -> tuple[str, str]:
        if self._metrics is not None:
            self._metrics.payload_fetch(outcome)
        return code, message[:1].upper() + message[1:]
