"""The left-padded batch cache of sie.worker.generation.kv_cache: joining batches, keeping rows, feeding a step."""

from __future__ import annotations

import numpy as np

from sie.worker.generation.kv_cache import BatchCache, CacheShape

SHAPE = CacheShape(layers=1, kv_heads=1, head_dim=1)
KEY, VALUE = "past_key_values.0.key", "past_key_values.0.value"


def rows_of(values: list[list[float]]) -> BatchCache:
    """A batch whose cache holds `values` (row by row, one number per position) and whose mask marks them."""
    length = max(len(row) for row in values)
    past = np.zeros((len(values), 1, length, 1), dtype=np.float32)
    mask = np.zeros((len(values), length), dtype=np.int64)
    for index, row in enumerate(values):
        past[index, 0, length - len(row) :, 0] = row
        mask[index, length - len(row) :] = 1
    return BatchCache({KEY: past, VALUE: past * 10}, mask)


def test_joining_left_pads_the_shorter_batch() -> None:
    joined = BatchCache.empty(SHAPE).join(rows_of([[1, 2]])).join(rows_of([[3, 4, 5, 6]]))
    assert joined.mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert joined.past[KEY][:, 0, :, 0].tolist() == [[0, 0, 1, 2], [3, 4, 5, 6]]
    assert joined.past[VALUE][:, 0, :, 0].tolist() == [[0, 0, 10, 20], [30, 40, 50, 60]]
    assert joined.positions().tolist() == [[2], [4]]


def test_keeping_rows_trims_columns_no_row_uses() -> None:
    batch = rows_of([[1], [2, 3, 4], [5, 6]])
    kept = batch.keep([2, 0])
    assert kept.mask.tolist() == [[1, 1], [0, 1]]
    assert kept.past[KEY][:, 0, :, 0].tolist() == [[5, 6], [0, 1]]
    assert batch.keep([]).length == 0 and batch.keep([]).rows == 0


def test_a_step_feeds_each_row_its_last_token_at_its_own_position() -> None:
    batch = rows_of([[1], [2, 3, 4]])
    feeds = batch.step_feeds([7, 8])
    assert feeds["input_ids"].tolist() == [[7], [8]]
    assert feeds["position_ids"].tolist() == [[1], [3]]
    assert feeds["attention_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    present = {name: np.concatenate([value, value[:, :, -1:]], axis=2) for name, value in batch.past.items()}
    assert batch.advanced(present).mask.tolist() == feeds["attention_mask"].tolist()
