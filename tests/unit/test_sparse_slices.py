"""SPLADE batches run in row slices whose MLM logits fit a budget; each slice is trimmed to its own longest row."""

from __future__ import annotations

import numpy as np

from sie.tokenization import pad_batch
from sie.worker.adapters.sparse import row_slices, rows_per_run


def test_rows_per_run_fits_the_logits_in_the_budget_and_is_never_zero() -> None:
    per_row = 100 * 30_522 * 4
    assert rows_per_run(100, 30_522, budget_bytes=per_row * 5) == 5
    assert rows_per_run(100, 30_522, budget_bytes=per_row * 5 + per_row - 1) == 5
    assert rows_per_run(512, 30_522, budget_bytes=1) == 1


def test_slices_cover_every_row_in_order_each_trimmed_to_its_longest() -> None:
    rows = [[101, 5, 102], [101, 5, 6, 7, 8, 102], [101, 102], [101, 9, 9, 102], [101, 3, 102]]
    batch = pad_batch(rows, None, pad_id=0)
    slices = list(row_slices(batch, 2))
    assert [part.input_ids.shape for part in slices] == [(2, 6), (2, 4), (1, 3)]
    rebuilt = [row[mask.astype(bool)].tolist() for part in slices
               for row, mask in zip(part.input_ids, part.attention_mask, strict=True)]  # fmt: skip
    assert rebuilt == rows
    assert all(np.array_equal(part.token_type_ids, np.zeros_like(part.input_ids)) for part in slices)
