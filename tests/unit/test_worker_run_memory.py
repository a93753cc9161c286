"""The run-memory estimate and the slicing of one batch into runs that fit SIE_WORKER_RUN_MEMORY_BYTES."""

from __future__ import annotations

import numpy as np

from sie.worker.run_memory import FLOAT_BYTES, TRIM_AFTER_BYTES, FreedHeap, RunMemory, run_in_slices

MIB = 1024 * 1024


def test_the_footprint_is_read_from_config_json_with_bert_base_defaults() -> None:
    config = {"num_attention_heads": 12, "hidden_size": 384, "intermediate_size": 1536}
    assert RunMemory.from_config(config) == RunMemory(12, 384, 1536)
    assert RunMemory.from_config({"n_head": 4, "d_model": 256}) == RunMemory(4, 256, 1024)
    assert RunMemory.from_config({"hidden_size": True, "num_attention_heads": "12"}) == RunMemory()


def test_the_estimate_grows_with_the_square_of_the_sequence() -> None:
    memory = RunMemory(12, 384, 1536)
    per_item = memory.bytes_for(1, 512)
    assert per_item == FLOAT_BYTES * 512 * (3 * 12 * 512 + 2 * 1536 + 4 * 384)
    assert 30 * MIB < per_item < 60 * MIB  # measured: about 30 MiB per 512-token row on rampart
    assert memory.bytes_for(8, 512) == 8 * per_item
    assert memory.bytes_for(1, 1024) > 3 * per_item
    assert memory.rows_per_run(512, 256 * MIB) == 256 * MIB // per_item
    assert memory.rows_per_run(512, 1) == 1  # never zero rows


class RecordingRun:
    """A session stand-in: returns each row's ids doubled and a per-row sum, and records the run sizes."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, feeds) -> list[np.ndarray]:
        ids = feeds["input_ids"]
        self.sizes.append(len(ids))
        return [ids * 2, ids.sum(axis=1)]


def test_a_batch_over_the_budget_runs_in_row_slices_with_the_same_outputs() -> None:
    memory = RunMemory(12, 384, 1536)
    ids = np.arange(10 * 512, dtype=np.int64).reshape(10, 512)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    whole, sliced = RecordingRun(), RecordingRun()
    expected = run_in_slices(whole, feeds, memory, budget_bytes=10**12)
    outputs = run_in_slices(sliced, feeds, memory, budget_bytes=3 * memory.bytes_for(1, 512))
    assert whole.sizes == [10] and sliced.sizes == [3, 3, 3, 1]
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_single_row_or_a_batch_without_rows_runs_whole() -> None:
    memory = RunMemory()
    run = RecordingRun()
    run_in_slices(run, {"input_ids": np.zeros((1, 4096), dtype=np.int64)}, memory, budget_bytes=1)
    assert run.sizes == [1]


class CountingRelease:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def test_a_large_batch_leaves_a_trim_to_make_and_does_not_trim_inline() -> None:
    memory = RunMemory(12, 384, 1536)
    released = CountingRelease()
    heap = FreedHeap(release=released)
    small = {"input_ids": np.zeros((2, 16), dtype=np.int64)}
    run_in_slices(RecordingRun(), small, memory, budget_bytes=10**12, heap=heap)
    assert not heap.pending
    assert memory.bytes_for(32, 128) > TRIM_AFTER_BYTES
    large = {"input_ids": np.zeros((32, 128), dtype=np.int64)}
    run_in_slices(RecordingRun(), large, memory, budget_bytes=10**12, heap=heap)
    assert heap.pending and released.calls == 0  # the runner trims once idle, not the run itself
    heap.release()
    assert not heap.pending and released.calls == 1
