"""Response chunking v1: the refusal strings, the chunk frames, and verified reassembly (sie.ipc.chunking)."""

import dataclasses
import hashlib
import os

import attrs
import msgpack
import pytest

from sie.ipc.chunking import (
    DEFAULT_LIMITS,
    NOT_NEGOTIATED,
    OVER_BOUNDS,
    ChunkAssembler,
    ChunkBudget,
    ChunkLimits,
    chunk_count,
    chunk_frames,
    refusal,
    reservation_bytes,
    transfer_digest,
)
from sie.ipc.errors import IpcProtocolError
from sie.wire import structure
from sie.wire.ipc import IpcResponseChunkV1

SMALL = ChunkLimits(max_frame_bytes=1000, max_payload_bytes=300, max_chunks=8, max_total_bytes=2000)


def chunks_of(
    payload: bytes, request_id: str = "r", limits: ChunkLimits = SMALL
) -> list[tuple[IpcResponseChunkV1, int]]:
    frames = list(chunk_frames(request_id, payload, transfer_digest(payload), limits))
    return [(structure(msgpack.unpackb(frame), IpcResponseChunkV1), len(frame)) for frame in frames]


def feed(assembler: ChunkAssembler, chunks) -> bytearray | None:
    result = None
    for chunk, size in chunks:
        result = assembler.push(chunk, size)
    return result


def test_the_contract_limits():
    assert (DEFAULT_LIMITS.max_frame_bytes, DEFAULT_LIMITS.max_payload_bytes) == (32 << 20, 4 << 20)
    assert (DEFAULT_LIMITS.max_chunks, DEFAULT_LIMITS.max_total_bytes) == (64, 128 << 20)
    assert DEFAULT_LIMITS.max_chunk_frame_bytes == (4 << 20) + 4096


def test_the_exact_refusal_strings():
    assert NOT_NEGOTIATED == "IPC response exceeds the legacy frame limit; response chunking v1 was not negotiated"
    assert OVER_BOUNDS == "IPC response exceeds the negotiated response chunking v1 bounds"


@pytest.mark.parametrize(
    ("size", "accepts", "expected"),
    [
        (1000, False, None),  # at the legacy limit: one frame
        (1001, False, NOT_NEGOTIATED),
        (1001, True, None),
        (2000, True, None),
        (2001, True, OVER_BOUNDS),  # over max_total_bytes
    ],
)
def test_refusal(size: int, accepts: bool, expected: str | None):
    assert refusal("r", size, accepts, SMALL) == expected


def test_refusal_over_the_chunk_count():
    limits = dataclasses.replace(SMALL, max_chunks=3)
    assert chunk_count(1201, limits) == 5
    assert refusal("r", 1201, True, limits) == OVER_BOUNDS
    assert refusal("r", 900, True, ChunkLimits(800, 300, 3, 2000)) is None


def test_refusal_when_the_request_id_would_overflow_a_chunk_frame():
    assert refusal("r" * 5000, 1500, True, SMALL) == OVER_BOUNDS


def test_chunk_frames_slice_the_exact_bytes():
    payload = os.urandom(1500)
    frames = [msgpack.unpackb(frame) for frame in chunk_frames("ipc-7", payload, transfer_digest(payload), SMALL)]
    assert [frame["chunk_index"] for frame in frames] == [0, 1, 2, 3, 4]
    assert list(frames[0]) == [
        "version", "request_id", "transfer_digest", "chunk_index", "chunk_count", "total_bytes", "payload", "kind",
    ]  # fmt: skip
    assert {(f["version"], f["request_id"], f["chunk_count"], f["total_bytes"], f["kind"]) for f in frames} == {
        (1, "ipc-7", 5, 1500, "ipc_response_chunk_v1")
    }
    assert {f["transfer_digest"] for f in frames} == {hashlib.sha256(payload).digest()}
    assert b"".join(f["payload"] for f in frames) == payload
    assert max(len(f["payload"]) for f in frames) == 300


def test_chunk_payloads_are_msgpack_bin():
    frame = next(chunk_frames("r", b"z" * 1200, bytes(32), SMALL))
    decoded = msgpack.unpackb(frame, raw=False)
    assert isinstance(decoded["payload"], bytes) and isinstance(decoded["transfer_digest"], bytes)


def test_round_trip_and_budget_release():
    payload = os.urandom(1999)
    budget = ChunkBudget(10_000)
    assembler = ChunkAssembler("r", SMALL, budget)
    chunks = chunks_of(payload)
    assert feed(assembler, chunks[:-1]) is None and assembler.in_progress
    assert budget.used_bytes == reservation_bytes(1999) == 2 * 1999 + 4096
    assert bytes(feed(assembler, chunks[-1:])) == payload
    assert not assembler.in_progress
    assert budget.used_bytes == reservation_bytes(1999)  # held until the caller has decoded the bytes
    assembler.close()
    assert budget.used_bytes == 0


def test_the_real_limits_round_trip_40_mib():
    payload = os.urandom(40 << 20)
    assembler = ChunkAssembler("r", DEFAULT_LIMITS)
    chunks = chunks_of(payload, limits=DEFAULT_LIMITS)
    assert len(chunks) == 10 and max(size for _, size in chunks) <= DEFAULT_LIMITS.max_chunk_frame_bytes
    assert feed(assembler, chunks) == payload


def _tamper(chunks, index: int, **changes):
    chunk, size = chunks[index]
    chunks[index] = (attrs.evolve(chunk, **changes), size)
    return chunks


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: _tamper(c, 2, payload=b"x" * len(c[2][0].payload)), "digest is invalid"),
        (lambda c: [c[i] for i in (0, 2, 3, 4)], "index 2 is duplicate or out of order (expected 1)"),
        (lambda c: [c[0], c[0]], "index 0 is duplicate or out of order (expected 1)"),
        (lambda c: c[1:], "must start at index zero"),
        (lambda c: _tamper(c, 1, request_id="other"), "for 'other' on request 'r'"),
        (lambda c: _tamper(c, 0, version=2), "version mismatch"),
        (lambda c: _tamper(c, 1, chunk_count=6), "layout changed during transfer"),
        (lambda c: _tamper(c, 1, total_bytes=1501), "layout changed during transfer"),
        (lambda c: _tamper(c, 1, transfer_digest=bytes(32)), "layout changed during transfer"),
        (lambda c: _tamper(c, 0, transfer_digest=bytes(31)), "bounds are invalid"),
        (lambda c: _tamper(c, 0, payload=b""), "bounds are invalid"),
        (lambda c: _tamper(c, 0, payload=b"x" * 301), "bounds are invalid"),
        (lambda c: _tamper(c, 0, kind="future_v2"), "not an IPC response chunk v1"),
        (lambda c: c + [c[4]], "after the transfer completed"),
    ],
)
def test_verification_failures(mutate, message: str):
    payload = os.urandom(1500)
    assembler = ChunkAssembler("r", SMALL)
    with pytest.raises(IpcProtocolError, match="IPC response chunk") as caught:
        feed(assembler, mutate(chunks_of(payload)))
    assert message in str(caught.value)


def test_a_total_within_the_legacy_limit_is_invalid():
    # A response that fits one frame must never arrive chunked.
    chunks = chunks_of(b"q" * 900, limits=ChunkLimits(max_frame_bytes=100, max_payload_bytes=300))
    with pytest.raises(IpcProtocolError, match="bounds are invalid"):
        feed(ChunkAssembler("r", SMALL), chunks)


def test_more_bytes_than_declared():
    payload = os.urandom(1450)
    chunks = chunks_of(payload)
    chunks = _tamper(chunks, 4, payload=chunks[4][0].payload + b"extra")
    with pytest.raises(IpcProtocolError, match="exceed their declared total_bytes"):
        feed(ChunkAssembler("r", SMALL), chunks)


def test_fewer_bytes_than_declared():
    payload = os.urandom(1500)
    chunks = chunks_of(payload)
    chunks = _tamper(chunks, 4, payload=chunks[4][0].payload[:-1])
    with pytest.raises(IpcProtocolError, match="carried 1499 bytes, declared 1500"):
        feed(ChunkAssembler("r", SMALL), chunks)


def test_a_chunk_frame_over_payload_plus_4_kib_is_refused():
    chunk, _ = chunks_of(os.urandom(1500))[0]
    with pytest.raises(IpcProtocolError, match="frame too large"):
        ChunkAssembler("r", SMALL).push(chunk, SMALL.max_payload_bytes + 4096 + 1)


def test_the_budget_is_shared_and_refuses_a_transfer_over_it():
    budget = ChunkBudget(reservation_bytes(1500) + 10)
    first, second = ChunkAssembler("a", SMALL, budget), ChunkAssembler("b", SMALL, budget)
    first.push(*chunks_of(os.urandom(1500), "a")[0])
    with pytest.raises(IpcProtocolError, match="global assembly budget"):
        second.push(*chunks_of(os.urandom(1500), "b")[0])
    first.close()
    assert budget.used_bytes == 0
    assert second.push(*chunks_of(os.urandom(1500), "b")[0]) is None
