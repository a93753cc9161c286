"""Response chunking v1 (contracts Part A §2.1, seed 001 "IPC"): the worker's plan for a response over the legacy
frame limit, and the client's verified reassembly of it.

The chunk payloads are slices of the exact bytes of the one legacy frame the response would have been; the receiver
checks identity, stable layout, index order, total length and SHA-256 before anything decodes those bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from sie.ipc.errors import IpcProtocolError
from sie.wire.codec import packb
from sie.wire.ipc import (
    IPC_CHUNK_MAX_COUNT,
    IPC_CHUNK_MAX_PAYLOAD_BYTES,
    IPC_CHUNK_MAX_TOTAL_BYTES,
    IPC_MAX_FRAME_BYTES,
    IPC_RESPONSE_CHUNK_KIND,
    IPC_VERSION,
    IpcResponseChunkV1,
)

NOT_NEGOTIATED: Final = "IPC response exceeds the legacy frame limit; response chunking v1 was not negotiated"
OVER_BOUNDS: Final = "IPC response exceeds the negotiated response chunking v1 bounds"
# A complete chunk frame may exceed its payload ceiling by this much (seed 001 "IPC").
CHUNK_FRAME_HEADROOM_BYTES: Final = 4 * 1024
DIGEST_BYTES: Final = 32
# A bin8 header is 2 bytes, a bin32 header (any payload of 64 KiB or more) 5: the template below packs b"".
_BIN_HEADER_GROWTH: Final = 3


@dataclass(frozen=True, slots=True)
class ChunkLimits:
    """The v1 bounds; production uses the contract's values, tests may shrink them to exercise chunking cheaply."""

    max_frame_bytes: int = IPC_MAX_FRAME_BYTES
    max_payload_bytes: int = IPC_CHUNK_MAX_PAYLOAD_BYTES
    max_chunks: int = IPC_CHUNK_MAX_COUNT
    max_total_bytes: int = IPC_CHUNK_MAX_TOTAL_BYTES

    @property
    def max_chunk_frame_bytes(self) -> int:
        """The largest complete chunk frame a receiver accepts."""
        return self.max_payload_bytes + CHUNK_FRAME_HEADROOM_BYTES

    @property
    def max_read_bytes(self) -> int:
        """The largest frame a client reads: a legacy response or a chunk frame."""
        return max(self.max_frame_bytes, self.max_chunk_frame_bytes)

    @property
    def reservation_limit_bytes(self) -> int:
        """What one maximal transfer reserves from a ChunkBudget."""
        return reservation_bytes(self.max_total_bytes)


DEFAULT_LIMITS: Final = ChunkLimits()


def reservation_bytes(total_bytes: int) -> int:
    """Twice the declared size plus headroom: the assembly buffer, then the decoded response (seed 001 "IPC")."""
    return 2 * total_bytes + CHUNK_FRAME_HEADROOM_BYTES


def chunk_count(total_bytes: int, limits: ChunkLimits) -> int:
    """How many chunks of at most `max_payload_bytes` carry `total_bytes`."""
    return -(-total_bytes // limits.max_payload_bytes)


# --- producing -----------------------------------------------------------------------------------


def _chunk_map(request_id: str, digest: bytes, index: int, count: int, total: int, payload: object) -> dict:
    return {
        "version": IPC_VERSION,
        "request_id": request_id,
        "transfer_digest": digest,
        "chunk_index": index,
        "chunk_count": count,
        "total_bytes": total,
        "payload": payload,
        "kind": IPC_RESPONSE_CHUNK_KIND,
    }


def refusal(
    request_id: str, total_bytes: int, accepts_chunks: bool, limits: ChunkLimits = DEFAULT_LIMITS
) -> str | None:
    """Why a serialized response of `total_bytes` cannot be sent, or None when it can (as one frame or as chunks)."""
    if total_bytes <= limits.max_frame_bytes:
        return None
    if not accepts_chunks:
        return NOT_NEGOTIATED
    count = chunk_count(total_bytes, limits)
    if total_bytes > limits.max_total_bytes or count > limits.max_chunks:
        return OVER_BOUNDS
    # A very long request id could push a full chunk frame over what the receiver accepts.
    template = packb(_chunk_map(request_id, bytes(DIGEST_BYTES), count - 1, count, total_bytes, b""))
    if len(template) + _BIN_HEADER_GROWTH + limits.max_payload_bytes > limits.max_chunk_frame_bytes:
        return OVER_BOUNDS
    return None


def transfer_digest(payload: bytes) -> bytes:
    """SHA-256 of the exact legacy-frame bytes (hashlib releases the GIL, so callers may run it in a thread)."""
    return hashlib.sha256(payload).digest()


def chunk_frames(
    request_id: str, payload: bytes, digest: bytes, limits: ChunkLimits = DEFAULT_LIMITS
) -> Iterator[bytes]:
    """The ordered chunk frame bodies of `payload`; call only when `refusal` returned None for it."""
    view = memoryview(payload)
    count = chunk_count(len(payload), limits)
    step = limits.max_payload_bytes
    for index in range(count):
        piece = view[index * step : (index + 1) * step]
        yield packb(_chunk_map(request_id, digest, index, count, len(payload), piece))


# --- reassembling --------------------------------------------------------------------------------


class ChunkBudgetError(IpcProtocolError):
    """A chunked transfer refused because the process's reassembly budget is spent (not a malformed transfer)."""


class ChunkBudget:
    """Bytes reserved by the reassemblies in progress; share one object across every client of a process.

    Used from one event loop only, so a plain counter is enough.
    """

    def __init__(self, limit_bytes: int = DEFAULT_LIMITS.reservation_limit_bytes) -> None:
        self.limit_bytes = limit_bytes
        self.used_bytes = 0

    def reserve(self, nbytes: int) -> None:
        if self.used_bytes + nbytes > self.limit_bytes:
            raise ChunkBudgetError("IPC response chunk transfer exceeds the global assembly budget")
        self.used_bytes += nbytes

    def release(self, nbytes: int) -> None:
        self.used_bytes -= nbytes


@dataclass(slots=True)
class _Transfer:
    digest: bytes
    chunk_count: int
    total_bytes: int
    reserved: int
    buffer: bytearray
    hasher: Any
    next_index: int = 0


class ChunkAssembler:
    """Rebuilds one response from its chunks, checking each on arrival; `close()` releases the budget reservation.

    Keep it open until the rebuilt bytes are decoded: the reservation covers the decoded response too.
    """

    def __init__(
        self, request_id: str, limits: ChunkLimits = DEFAULT_LIMITS, budget: ChunkBudget | None = None
    ) -> None:
        self.request_id = request_id
        self.limits = limits
        self.budget = budget if budget is not None else ChunkBudget(limits.reservation_limit_bytes)
        self._transfer: _Transfer | None = None

    @property
    def in_progress(self) -> bool:
        """True between the first chunk and the last."""
        return self._transfer is not None and self._transfer.next_index < self._transfer.chunk_count

    def push(self, chunk: IpcResponseChunkV1, frame_bytes: int) -> bytearray | None:
        """Add the next chunk (its frame was `frame_bytes` long); the verified response bytes after the last one."""
        if frame_bytes > self.limits.max_chunk_frame_bytes:
            raise IpcProtocolError(f"IPC response chunk frame too large: {frame_bytes} bytes")
        self._check_identity(chunk)
        self._check_bounds(chunk)
        transfer = self._transfer or self._start(chunk)
        self._check_layout(transfer, chunk)
        if len(transfer.buffer) + len(chunk.payload) > transfer.total_bytes:
            raise IpcProtocolError("IPC response chunks exceed their declared total_bytes")
        transfer.buffer += chunk.payload
        transfer.hasher.update(chunk.payload)
        transfer.next_index += 1
        if transfer.next_index < transfer.chunk_count:
            return None
        return self._finish(transfer)

    def close(self) -> None:
        """Release the reservation; the assembler accepts nothing afterwards."""
        if self._transfer is not None:
            self.budget.release(self._transfer.reserved)
            self._transfer.reserved = 0
            self._transfer.buffer = bytearray()

    def _check_identity(self, chunk: IpcResponseChunkV1) -> None:
        if chunk.kind != IPC_RESPONSE_CHUNK_KIND:
            raise IpcProtocolError(f"not an IPC response chunk v1: kind {chunk.kind!r}")
        if chunk.version != IPC_VERSION:
            raise IpcProtocolError(f"IPC response chunk version mismatch: {chunk.version}")
        if chunk.request_id != self.request_id:
            raise IpcProtocolError(f"IPC response chunk for {chunk.request_id!r} on request {self.request_id!r}")

    def _check_bounds(self, chunk: IpcResponseChunkV1) -> None:
        limits = self.limits
        valid = (
            0 < chunk.chunk_count <= limits.max_chunks
            and limits.max_frame_bytes < chunk.total_bytes <= limits.max_total_bytes
            and 0 < len(chunk.payload) <= limits.max_payload_bytes
            and len(chunk.transfer_digest) == DIGEST_BYTES
        )
        if not valid:
            raise IpcProtocolError("IPC response chunk bounds are invalid")

    def _start(self, chunk: IpcResponseChunkV1) -> _Transfer:
        if chunk.chunk_index != 0:
            raise IpcProtocolError(f"IPC response chunk sequence must start at index zero, got {chunk.chunk_index}")
        reserved = reservation_bytes(chunk.total_bytes)
        self.budget.reserve(reserved)
        self._transfer = _Transfer(
            digest=chunk.transfer_digest, chunk_count=chunk.chunk_count, total_bytes=chunk.total_bytes,
            reserved=reserved, buffer=bytearray(), hasher=hashlib.sha256(),
        )  # fmt: skip
        return self._transfer

    def _check_layout(self, transfer: _Transfer, chunk: IpcResponseChunkV1) -> None:
        if transfer.next_index >= transfer.chunk_count:
            raise IpcProtocolError("IPC response chunk after the transfer completed")
        stable = (chunk.chunk_count, chunk.total_bytes, chunk.transfer_digest) == (
            transfer.chunk_count, transfer.total_bytes, transfer.digest,
        )  # fmt: skip
        if not stable:
            raise IpcProtocolError("IPC response chunk layout changed during transfer")
        if chunk.chunk_index != transfer.next_index:
            raise IpcProtocolError(
                f"IPC response chunk index {chunk.chunk_index} is duplicate or out of order "
                f"(expected {transfer.next_index})"
            )

    def _finish(self, transfer: _Transfer) -> bytearray:
        if len(transfer.buffer) != transfer.total_bytes:
            raise IpcProtocolError(
                f"IPC response chunks carried {len(transfer.buffer)} bytes, declared {transfer.total_bytes}"
            )
        if transfer.hasher.digest() != transfer.digest:
            raise IpcProtocolError("IPC response chunk digest is invalid")
        return transfer.buffer
