"""result_chunk_v1 end to end without a broker: a WorkResult cut by sie.wire.result_chunks and put back together by
the gateway's ResultReassembly (seed 000 §16.2, seed 001): order, duplicates, retries, bounds, digest, budgets."""

from __future__ import annotations

import random

import attrs
import numpy as np
import pytest

from sie.gateway.result_chunks import (
    GLOBAL_BUDGET,
    REQUEST_BUDGET,
    ChunkBudget,
    ChunkTransferError,
    ResultReassembly,
    reservation_bytes,
)
from sie.wire import packb, to_msgpack, unpackb, unstructure
from sie.wire.payload import ResultBody
from sie.wire.queue import RESULT_CHUNK_MAX_COUNT, RESULT_CHUNK_MAX_TOTAL_BYTES, ResultChunkV1, WorkResult
from sie.wire.result_chunks import (
    BROKER_LIMIT_TOO_SMALL,
    OVER_TRANSFER_BOUNDS,
    chunk_bytes_for,
    decode_inbox_message,
    refusal,
    split,
    transfer_digest,
)

REQUEST = "gw-7"
LIMIT = 4096  # a broker message limit small enough to need a handful of chunks


def big_result(index: int = 0, values: int = 4000, seed: int = 0) -> WorkResult:
    vectors = np.random.default_rng(seed).standard_normal((values // 100, 100)).astype(np.float32)
    body = {"multivector": {"dims": 100, "dtype": "float32", "values": vectors}}
    return WorkResult(work_item_id=f"{REQUEST}.{index}", request_id=REQUEST, item_index=index, success=True,
                      result_msgpack=ResultBody.of(body), worker_id="w-1", inference_ms=3.5)  # fmt: skip


def chunks_of(result: WorkResult, limit: int = LIMIT) -> list[ResultChunkV1]:
    payload = to_msgpack(result)
    chunk_bytes = chunk_bytes_for(result, limit)
    assert refusal(len(payload), chunk_bytes) is None
    return split(result, payload, transfer_digest(payload), chunk_bytes)


def wire(chunk: ResultChunkV1) -> ResultChunkV1:
    """The chunk as the gateway receives it: packed, then decoded by the inbox decoder."""
    decoded = decode_inbox_message(to_msgpack(chunk))
    assert isinstance(decoded, ResultChunkV1)
    return decoded


def feed(reassembly: ResultReassembly, chunks: list[ResultChunkV1]) -> list[WorkResult]:
    return [result for chunk in chunks if (result := reassembly.add(wire(chunk))) is not None]


def same(left: WorkResult, right: WorkResult) -> bool:
    return to_msgpack(left) == to_msgpack(right)


# --- splitting --------------------------------------------------------------------------------------------


def test_every_chunk_envelope_fits_the_broker_limit_and_slices_the_exact_result_bytes() -> None:
    result = big_result()
    payload = to_msgpack(result)
    chunks = chunks_of(result)
    assert len(chunks) > 4
    assert all(len(to_msgpack(chunk)) <= LIMIT for chunk in chunks)
    assert b"".join(bytes(chunk.payload) for chunk in chunks) == payload
    assert {(c.chunk_count, c.total_bytes, c.transfer_digest) for c in chunks} == {
        (len(chunks), len(payload), transfer_digest(payload))
    }
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    assert unpackb(to_msgpack(chunks[0]))["kind"] == "result_chunk_v1"


def test_the_inbox_decoder_tells_results_from_chunks_by_the_exact_kind() -> None:
    result = big_result(values=100)
    assert isinstance(decode_inbox_message(to_msgpack(result)), WorkResult)
    # A WorkResult that grew fields (even `total_bytes`) stays a WorkResult: only the exact kind selects v1.
    grown = unstructure(result) | {"total_bytes": 3, "kind": "result_chunk_v2"}
    assert isinstance(decode_inbox_message(packb(grown)), WorkResult)


def test_transfers_past_the_v1_bounds_are_refused() -> None:
    assert refusal(RESULT_CHUNK_MAX_TOTAL_BYTES + 1, 768 * 1024) == OVER_TRANSFER_BOUNDS
    assert refusal(RESULT_CHUNK_MAX_COUNT * 1000 + 1, 1000) == BROKER_LIMIT_TOO_SMALL  # 65 chunks
    assert refusal(RESULT_CHUNK_MAX_COUNT * 1000, 1000) is None
    assert chunk_bytes_for(big_result(), 100) <= 0  # no envelope fits at all
    assert refusal(10_000, chunk_bytes_for(big_result(), 100)) == BROKER_LIMIT_TOO_SMALL


# --- reassembling -----------------------------------------------------------------------------------------


def test_chunks_in_order_rebuild_the_same_result_and_reserve_three_times_its_size() -> None:
    result = big_result(index=1)
    budget = ChunkBudget()
    reassembly = ResultReassembly(REQUEST, 2, budget)
    (rebuilt,) = feed(reassembly, chunks_of(result))
    assert same(rebuilt, result)
    assert np.array_equal(rebuilt.result_msgpack.value["multivector"]["values"],
                          result.result_msgpack.value["multivector"]["values"])  # fmt: skip
    assert budget.reserved_bytes == reservation_bytes(len(to_msgpack(result))) == reassembly.reserved_bytes
    reassembly.release()
    assert budget.reserved_bytes == 0


def test_out_of_order_and_duplicate_chunks_are_accepted() -> None:
    result = big_result()
    chunks = chunks_of(result)
    shuffled = chunks + chunks[:3]  # byte-identical duplicates, some arriving after the transfer completed
    random.Random(5).shuffle(shuffled)
    assert [chunk.chunk_index for chunk in shuffled[: len(chunks)]] != list(range(len(chunks)))
    rebuilt = feed(ResultReassembly(REQUEST, 1, ChunkBudget()), shuffled)
    assert len(rebuilt) == 1 and same(rebuilt[0], result)


def test_a_conflicting_duplicate_fails_the_transfer() -> None:
    chunks = chunks_of(big_result())
    forged = attrs.evolve(chunks[1], payload=bytes(len(chunks[1].payload)))
    reassembly = ResultReassembly(REQUEST, 1, ChunkBudget())
    feed(reassembly, chunks[:2])
    with pytest.raises(ChunkTransferError, match="different bytes"):
        reassembly.add(wire(forged))


def test_a_bad_digest_fails_the_transfer() -> None:
    result = big_result()
    payload = to_msgpack(result)
    chunks = split(result, payload, transfer_digest(b"something else"), chunk_bytes_for(result, LIMIT))
    reassembly = ResultReassembly(REQUEST, 1, ChunkBudget())
    with pytest.raises(ChunkTransferError, match="digest"):
        feed(reassembly, chunks)


def test_chunks_that_do_not_add_up_to_their_declared_size_fail() -> None:
    chunks = chunks_of(big_result())
    short = [attrs.evolve(chunk, total_bytes=chunk.total_bytes + 10) for chunk in chunks]
    with pytest.raises(ChunkTransferError, match="declared"):
        feed(ResultReassembly(REQUEST, 1, ChunkBudget()), short)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"chunk_count": RESULT_CHUNK_MAX_COUNT + 1}, "more than 64 chunks"),
        ({"total_bytes": RESULT_CHUNK_MAX_TOTAL_BYTES + 1}, "over 16 MiB"),
        ({"chunk_index": 9, "chunk_count": 9}, "index past the count"),
        ({"transfer_digest": b"short"}, "a digest that is not SHA-256"),
        ({"payload": b""}, "an empty chunk"),
        ({"item_index": 3, "work_item_id": f"{REQUEST}.3"}, "an item the request does not have"),
        ({"work_item_id": "gw-8.0"}, "another request's item"),
    ],
)
def test_chunks_outside_the_v1_bounds_or_this_request_fail(change: dict, why: str) -> None:
    chunk = attrs.evolve(chunks_of(big_result())[0], **change)
    with pytest.raises(ChunkTransferError):
        ResultReassembly(REQUEST, 1, ChunkBudget()).add(chunk)


def test_a_reassembled_result_naming_another_item_fails() -> None:
    impostor = big_result(index=0)
    chunks = [attrs.evolve(chunk, item_index=1, work_item_id=f"{REQUEST}.1") for chunk in chunks_of(impostor)]
    with pytest.raises(ChunkTransferError, match="names"):
        feed(ResultReassembly(REQUEST, 2, ChunkBudget()), chunks)


def test_chunk_zero_of_a_retry_replaces_the_stale_transfer_and_its_late_fragments_are_ignored() -> None:
    first, retry = big_result(seed=1), big_result(seed=2)  # a redelivered item computed again: other bytes
    old, new = chunks_of(first), chunks_of(retry)
    budget = ChunkBudget()
    reassembly = ResultReassembly(REQUEST, 1, budget)
    assert feed(reassembly, old[:2]) == []
    assert feed(reassembly, [new[0], old[2], old[3], new[1], old[0]]) == []  # late and replayed old fragments
    (rebuilt,) = feed(reassembly, new[2:])
    assert same(rebuilt, retry)
    assert budget.reserved_bytes == reservation_bytes(len(to_msgpack(retry)))  # the replaced one was released


def test_an_unknown_non_zero_fragment_does_not_disturb_the_transfer_in_progress() -> None:
    result, other = big_result(seed=1), big_result(seed=3)
    chunks, stray = chunks_of(result), chunks_of(other)
    reassembly = ResultReassembly(REQUEST, 1, ChunkBudget())
    assert feed(reassembly, [chunks[0], stray[2], stray[3]]) == []
    (rebuilt,) = feed(reassembly, chunks[1:])
    assert same(rebuilt, result)


def test_a_transfer_over_the_gateway_budget_is_refused_and_counted() -> None:
    result = big_result()
    need = reservation_bytes(len(to_msgpack(result)))
    budget = ChunkBudget(limit_bytes=need - 1)
    with pytest.raises(ChunkTransferError, match="budget"):
        ResultReassembly(REQUEST, 1, budget).add(chunks_of(result)[0])
    assert budget.rejections[GLOBAL_BUDGET] == 1 and budget.reserved_bytes == 0


def test_a_request_over_its_own_budget_is_refused_while_others_keep_theirs() -> None:
    first, second = big_result(index=0), big_result(index=1)
    need = reservation_bytes(len(to_msgpack(first)))
    budget = ChunkBudget()
    reassembly = ResultReassembly(REQUEST, 2, budget, request_limit_bytes=need + need // 2)
    feed(reassembly, chunks_of(first))
    with pytest.raises(ChunkTransferError, match="reserve"):
        reassembly.add(chunks_of(second)[0])
    assert budget.rejections[REQUEST_BUDGET] == 1
    assert budget.reserved_bytes == need
    reassembly.release()
    assert budget.reserved_bytes == 0


def test_forgetting_an_item_answered_otherwise_releases_its_transfer() -> None:
    budget = ChunkBudget()
    reassembly = ResultReassembly(REQUEST, 1, budget)
    feed(reassembly, chunks_of(big_result())[:2])
    assert budget.reserved_bytes > 0
    reassembly.forget(0)
    assert budget.reserved_bytes == 0 == reassembly.reserved_bytes
