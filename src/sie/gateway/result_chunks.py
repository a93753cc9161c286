"""Reassembly of result_chunk_v1 transfers on the gateway (seed 000 §16.2 step 4): per request, each item's chunks
are checked as they arrive, put back in order, verified against their SHA-256 and decoded into the WorkResult
they were cut from; memory is reserved before a transfer keeps any chunk. Pure bookkeeping: no I/O, no metrics
(the counters here are what a metric would read).

Rules: chunks may arrive out of order, and byte-identical duplicates are ignored. A chunk whose layout (digest,
count, size) differs from the transfer in progress replaces it when it is chunk zero (a redelivered item computed
again); the replaced layout is tombstoned, so its late fragments are ignored instead of mixing in, and so are other
unknown non-zero fragments. Anything else that does not add up (identity, bounds, conflicting bytes, length,
digest, the decoded result) is a ChunkTransferError: the request fails closed.

Memory: a transfer reserves three times its size plus 4 KiB (fragments, the joined copy, the decoded result kept
until the request completes), at most 64 MiB per request and 256 MiB per gateway; reservations are released when
the request ends, or when a transfer is replaced.
"""

from __future__ import annotations

import collections
import hashlib
from typing import Any, Final

from sie.wire import DecodeError, from_msgpack
from sie.wire.queue import (
    RESULT_CHUNK_MAX_COUNT,
    RESULT_CHUNK_MAX_PAYLOAD_BYTES,
    RESULT_CHUNK_MAX_TOTAL_BYTES,
    ResultChunkV1,
    WorkResult,
)
from sie.wire.result_chunks import DIGEST_BYTES

ITEM_HEADROOM_BYTES: Final = 4 * 1024
REQUEST_BUDGET_BYTES: Final = 64 * 2**20
GATEWAY_BUDGET_BYTES: Final = 256 * 2**20
# Replaced layouts remembered per item: enough for a few redeliveries racing each other.
MAX_TOMBSTONES_PER_ITEM: Final = 8

GLOBAL_BUDGET: Final = "global_budget"
REQUEST_BUDGET: Final = "request_budget"

Layout = tuple[bytes, int, int]  # (transfer_digest, chunk_count, total_bytes)


class ChunkTransferError(Exception):
    """A transfer that cannot be accepted; the message is for logs only, never for the caller."""


def reservation_bytes(total_bytes: int) -> int:
    """What one transfer of `total_bytes` reserves: three copies plus bookkeeping headroom (seed 000 §16.2)."""
    return 3 * total_bytes + ITEM_HEADROOM_BYTES


class ChunkBudget:
    """The gateway-wide reservation for transfers in progress; one object per gateway, used from one event loop.

    `reserved_bytes` and `rejections` (by reason) are what the reserved-bytes gauge and the rejections
    counter of seed 000 §16.2 report."""

    def __init__(self, limit_bytes: int = GATEWAY_BUDGET_BYTES) -> None:
        self.limit_bytes = limit_bytes
        self.reserved_bytes = 0
        self.rejections: collections.Counter[str] = collections.Counter()

    def reserve(self, nbytes: int) -> None:
        """Take `nbytes`; ChunkTransferError when the gateway-wide limit would be passed."""
        if self.reserved_bytes + nbytes > self.limit_bytes:
            self.rejections[GLOBAL_BUDGET] += 1
            raise ChunkTransferError(f"result chunk budget exhausted ({self.reserved_bytes} of {self.limit_bytes})")
        self.reserved_bytes += nbytes

    def release(self, nbytes: int) -> None:
        self.reserved_bytes -= nbytes


class _Transfer:
    """One item's transfer in progress: its layout, the chunks so far and the hash of their in-order prefix."""

    __slots__ = ("layout", "pieces", "received", "received_bytes", "hashed", "hasher", "reserved")

    def __init__(self, layout: Layout, reserved: int) -> None:
        self.layout = layout
        self.pieces: list[bytes | None] = [None] * layout[1]
        self.received = 0
        self.received_bytes = 0
        self.hashed = 0  # pieces[:hashed] are in the hasher
        self.hasher: Any = hashlib.sha256()
        self.reserved = reserved

    def add(self, index: int, payload: bytes) -> None:
        known = self.pieces[index]
        if known is not None:
            if known != payload:
                raise ChunkTransferError(f"chunk {index} arrived twice with different bytes")
            return
        if self.received_bytes + len(payload) > self.layout[2]:
            raise ChunkTransferError("chunks carry more bytes than their declared total_bytes")
        self.pieces[index] = payload
        self.received += 1
        self.received_bytes += len(payload)
        # Hash in canonical order as the prefix grows, so completion does not hash everything at once.
        while self.hashed < len(self.pieces) and self.pieces[self.hashed] is not None:
            self.hasher.update(self.pieces[self.hashed])
            self.hashed += 1

    @property
    def complete(self) -> bool:
        return self.received == len(self.pieces)

    def joined(self) -> bytes:
        if self.received_bytes != self.layout[2]:
            raise ChunkTransferError(f"chunks carried {self.received_bytes} bytes, declared {self.layout[2]}")
        if self.hasher.digest() != self.layout[0]:
            raise ChunkTransferError("the transfer digest does not match the reassembled bytes")
        data = b"".join(self.pieces)  # type: ignore[arg-type]  # complete: every piece is set
        self.pieces = []
        return data


def check_chunk(chunk: ResultChunkV1, request_id: str, total_items: int) -> None:
    """The static checks of one chunk: it names an item of this request and its bounds are v1's."""
    index = chunk.item_index
    if not 0 <= index < total_items or chunk.work_item_id != f"{request_id}.{index}":
        raise ChunkTransferError(f"chunk names item {chunk.work_item_id!r} (index {index}), not one of this request")
    count, total, size = chunk.chunk_count, chunk.total_bytes, len(chunk.payload)
    valid = (
        0 < count <= RESULT_CHUNK_MAX_COUNT
        and 0 <= chunk.chunk_index < count
        and count <= total <= min(RESULT_CHUNK_MAX_TOTAL_BYTES, count * RESULT_CHUNK_MAX_PAYLOAD_BYTES)
        and 0 < size <= min(RESULT_CHUNK_MAX_PAYLOAD_BYTES, total)
        and len(chunk.transfer_digest) == DIGEST_BYTES
    )
    if not valid:
        raise ChunkTransferError(
            f"chunk {chunk.chunk_index}/{count} of {total} bytes ({size} in this chunk) is outside the v1 bounds"
        )


class ResultReassembly:
    """The chunked transfers of one request's items; `release()` gives its reservations back (call it once the
    request ends, whatever the outcome)."""

    def __init__(self, request_id: str, total_items: int, budget: ChunkBudget,
                 request_limit_bytes: int = REQUEST_BUDGET_BYTES) -> None:  # fmt: skip
        self.request_id = request_id
        self.total_items = total_items
        self.budget = budget
        self.request_limit_bytes = request_limit_bytes
        self.reserved_bytes = 0
        self._transfers: dict[int, _Transfer] = {}
        self._tombstones: dict[int, collections.deque[Layout]] = {}
        self._completed: set[int] = set()  # items already rebuilt: their later chunks are redeliveries

    def add(self, chunk: ResultChunkV1) -> WorkResult | None:
        """Take one chunk; the item's decoded WorkResult once its last chunk arrived, else None.
        ChunkTransferError when the transfer is invalid or over budget."""
        check_chunk(chunk, self.request_id, self.total_items)
        item = chunk.item_index
        layout: Layout = (chunk.transfer_digest, chunk.chunk_count, chunk.total_bytes)
        if item in self._completed or layout in self._tombstones.get(item, ()):
            return None  # a late fragment of a replaced attempt
        transfer = self._transfers.get(item)
        if transfer is not None and transfer.layout != layout:
            if chunk.chunk_index != 0:
                return None  # an unknown retry fragment: its chunk zero has not replaced the current transfer
            self._replace(item, transfer)
            transfer = None
        if transfer is None:
            transfer = self._start(item, layout)
        transfer.add(chunk.chunk_index, bytes(chunk.payload))
        if not transfer.complete:
            return None
        return self._decode(chunk, transfer)

    def reopen(self, item: int) -> None:
        """Take chunks for `item` again: the result just rebuilt for it was not taken (a late answer from a worker the
        request fell back from), so another attempt's transfer must be able to complete."""
        self._completed.discard(item)

    def forget(self, item: int) -> None:
        """Drop the item's transfer in progress, if any, and its reservation (the item was answered otherwise)."""
        transfer = self._transfers.pop(item, None)
        if transfer is not None:
            self._give_back(transfer)

    def release(self) -> None:
        """Give every reservation back; the reassembly accepts nothing useful afterwards."""
        self.budget.release(self.reserved_bytes)
        self.reserved_bytes = 0
        self._transfers.clear()
        self._completed.update(range(self.total_items))

    def _start(self, item: int, layout: Layout) -> _Transfer:
        reserved = reservation_bytes(layout[2])
        if self.reserved_bytes + reserved > self.request_limit_bytes:
            self.budget.rejections[REQUEST_BUDGET] += 1
            raise ChunkTransferError(f"request {self.request_id} would reserve over {self.request_limit_bytes} bytes")
        self.budget.reserve(reserved)
        self.reserved_bytes += reserved
        transfer = self._transfers[item] = _Transfer(layout, reserved)
        return transfer

    def _replace(self, item: int, transfer: _Transfer) -> None:
        tombstones = self._tombstones.setdefault(item, collections.deque(maxlen=MAX_TOMBSTONES_PER_ITEM))
        tombstones.append(transfer.layout)
        self._give_back(transfer)
        del self._transfers[item]

    def _give_back(self, transfer: _Transfer) -> None:
        self.budget.release(transfer.reserved)
        self.reserved_bytes -= transfer.reserved
        transfer.reserved = 0

    def _decode(self, chunk: ResultChunkV1, transfer: _Transfer) -> WorkResult:
        data = transfer.joined()
        try:
            result = from_msgpack(data, WorkResult)
        except DecodeError as exc:
            raise ChunkTransferError(f"the reassembled bytes are not a WorkResult: {exc}") from None
        if (result.request_id, result.work_item_id, result.item_index) != (
            self.request_id, chunk.work_item_id, chunk.item_index,
        ):  # fmt: skip
            raise ChunkTransferError(
                f"the reassembled result names {result.work_item_id!r}, not {chunk.work_item_id!r}"
            )
        # The reservation stays held until the request ends: it covers the decoded result kept until then.
        self._completed.add(chunk.item_index)
        del self._transfers[chunk.item_index]
        return result
