"""result_chunk_v1 on the inbox (seed 000 §16.2, seed 001 "Preparation And Framing"): how a serialized WorkResult
too large for one broker message is cut into ResultChunkV1 envelopes that each fit, and how an inbox message is
told apart (an exact `kind` discriminator) and decoded. Pure; the reassembly with its memory budget is the
gateway's (sie.gateway.result_chunks), the publishing the sidecar's.

Chunks slice the exact bytes of the one WorkResult message the result would have been; their digest is the
SHA-256 of those bytes. A transfer is at most RESULT_CHUNK_MAX_COUNT chunks of at most
RESULT_CHUNK_MAX_PAYLOAD_BYTES, RESULT_CHUNK_MAX_TOTAL_BYTES in all.
"""

from __future__ import annotations

import hashlib
from typing import Final

from sie.wire.codec import packb, unpackb
from sie.wire.converter import structure, unstructure
from sie.wire.generate import GenerateChunk, is_generate_chunk
from sie.wire.queue import (
    RESULT_CHUNK_MAX_COUNT,
    RESULT_CHUNK_MAX_PAYLOAD_BYTES,
    RESULT_CHUNK_MAX_TOTAL_BYTES,
    ResultChunkV1,
    WorkResult,
    is_result_chunk,
)

DIGEST_BYTES: Final = 32
# A bin8 header is 2 bytes, a bin32 one (payloads of 64 KiB and more) 5: the envelope template packs b"".
_BIN_HEADER_GROWTH: Final = 3

# Why a result cannot travel as chunks: kept static, the gateway never sees more than the code.
OVER_TRANSFER_BOUNDS: Final = "exceeds the result_chunk_v1 bounds (16 MiB, 64 chunks)"
BROKER_LIMIT_TOO_SMALL: Final = "the broker's max_payload is too small for a bounded result_chunk_v1 transfer"


def chunk_count(total_bytes: int, chunk_bytes: int) -> int:
    """How many chunks of at most `chunk_bytes` carry `total_bytes`."""
    return -(-total_bytes // chunk_bytes)


def envelope_overhead(result: WorkResult) -> int:
    """Bytes a chunk envelope of `result` adds around its payload, at the widest counts and sizes."""
    template = ResultChunkV1(
        request_id=result.request_id, work_item_id=result.work_item_id, item_index=result.item_index,
        transfer_digest=bytes(DIGEST_BYTES), chunk_index=RESULT_CHUNK_MAX_COUNT, chunk_count=RESULT_CHUNK_MAX_COUNT,
        total_bytes=RESULT_CHUNK_MAX_TOTAL_BYTES, payload=b"",
    )  # fmt: skip
    return len(packb(unstructure(template))) + _BIN_HEADER_GROWTH


def chunk_bytes_for(result: WorkResult, max_message_bytes: int) -> int:
    """The payload size of each chunk so that a whole envelope fits a broker message of `max_message_bytes`
    (at most RESULT_CHUNK_MAX_PAYLOAD_BYTES; 0 or less when no envelope fits at all)."""
    return min(RESULT_CHUNK_MAX_PAYLOAD_BYTES, max_message_bytes - envelope_overhead(result))


def refusal(total_bytes: int, chunk_bytes: int) -> str | None:
    """Why `total_bytes` of serialized result cannot go as chunks of `chunk_bytes`, or None when it can."""
    if total_bytes > RESULT_CHUNK_MAX_TOTAL_BYTES:
        return OVER_TRANSFER_BOUNDS
    if chunk_bytes <= 0 or chunk_count(total_bytes, chunk_bytes) > RESULT_CHUNK_MAX_COUNT:
        return BROKER_LIMIT_TOO_SMALL
    return None


def transfer_digest(payload: bytes) -> bytes:
    """SHA-256 of the exact WorkResult bytes (hashlib releases the GIL: callers may run it in a thread)."""
    return hashlib.sha256(payload).digest()


def split(result: WorkResult, payload: bytes, digest: bytes, chunk_bytes: int) -> list[ResultChunkV1]:
    """The ordered chunks of `payload` (the serialized `result`); call only when `refusal` returned None.

    Each chunk borrows a view of `payload`, so the bytes are copied once, when an envelope is packed."""
    view = memoryview(payload)
    count = chunk_count(len(payload), chunk_bytes)
    return [
        ResultChunkV1(
            request_id=result.request_id,
            work_item_id=result.work_item_id,
            item_index=result.item_index,
            transfer_digest=digest,
            chunk_index=index,
            chunk_count=count,
            total_bytes=len(payload),
            payload=view[index * chunk_bytes : (index + 1) * chunk_bytes],  # type: ignore[arg-type]  # packed as bin
        )  # fmt: skip
        for index in range(count)
    ]


def decode_inbox_message(data: bytes | bytearray | memoryview) -> WorkResult | ResultChunkV1 | GenerateChunk:
    """An inbox message: a ResultChunkV1 when its `kind` is exactly `result_chunk_v1`, a GenerateChunk when it is
    exactly `generate_chunk`, else a WorkResult (readers ignore unknown fields, so a future WorkResult field such as
    `total_bytes` stays compatible). DecodeError when it is none of them."""
    message = unpackb(data)
    if isinstance(message, dict):
        if is_result_chunk(message):
            return structure(message, ResultChunkV1)
        if is_generate_chunk(message):
            return structure(message, GenerateChunk)
    return structure(message, WorkResult)
