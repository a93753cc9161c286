"""The left-padded batch cache of sie.worker.generation.kv_cache: joining batches, keeping rows, feeding a step."""

from __future__ import annotations

import numpy as np

from sie.worker.generation.kv_cache import (
    BatchCache,
    CacheShape,
    bytes_per_cached_token,
    bytes_per_row_state,
    empty_cache,
)

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


HYBRID = CacheShape(layers=2, kv_heads=1, head_dim=1, state_layers=(0,), conv_state=(3, 2), recurrent_state=(1, 2, 2))
CONV, RECURRENT = "past_key_values.0.conv", "past_key_values.0.recurrent"
LAYER_KEY = "past_key_values.1.key"


def hybrid_rows(values: list[list[float]]) -> BatchCache:
    """`rows_of` for a hybrid decoder (layer 0 linear attention, layer 1 attention): each row's states filled with
    its first value."""
    batch = rows_of(values)
    rows = len(values)
    first = np.asarray([row[0] for row in values], dtype=np.float32)
    states = {CONV: np.ones((rows, 3, 2), np.float32) * first[:, None, None],
              RECURRENT: np.ones((rows, 1, 2, 2), np.float32) * first[:, None, None, None]}  # fmt: skip
    return BatchCache({LAYER_KEY: batch.past[KEY], "past_key_values.1.value": batch.past[VALUE], **states}, batch.mask)


def test_a_hybrid_decoders_states_join_and_leave_with_their_rows_unpadded() -> None:
    """Qwen3.5's linear-attention states have no token axis: joining batches stacks them, keeping rows picks them,
    whatever the key/value columns do."""
    joined = BatchCache.empty(HYBRID).join(hybrid_rows([[1, 2]])).join(hybrid_rows([[3, 4, 5, 6], [7]]))
    assert joined.past[LAYER_KEY][:, 0, :, 0].tolist() == [[0, 0, 1, 2], [3, 4, 5, 6], [0, 0, 0, 7]]
    assert joined.past[CONV].shape == (3, 3, 2) and joined.past[CONV][:, 0, 0].tolist() == [1, 3, 7]
    kept = joined.keep([2, 0])
    assert kept.past[LAYER_KEY][:, 0, :, 0].tolist() == [[0, 7], [1, 2]]
    assert kept.past[RECURRENT].shape == (2, 1, 2, 2) and kept.past[RECURRENT][:, 0, 0, 0].tolist() == [7, 1]


def test_a_hybrid_decoders_empty_cache_and_bytes_count_its_states_apart() -> None:
    feeds = empty_cache(HYBRID, batch=2)
    assert set(feeds) == {CONV, RECURRENT, LAYER_KEY, "past_key_values.1.value"}
    assert feeds[CONV].shape == (2, 3, 2) and not feeds[RECURRENT].any()
    assert feeds[LAYER_KEY].shape == (2, 1, 0, 1)
    # one attention layer's key and value per token; 6 + 4 float32 numbers of state per row
    assert (bytes_per_cached_token(HYBRID), bytes_per_row_state(HYBRID), bytes_per_row_state(SHAPE)) == (8, 40, 0)
    config = {"num_hidden_layers": 4, "num_key_value_heads": 2, "head_dim": 8, "linear_attention_layers": [0, 1, 2],
              "linear_conv_state_shape": [56, 3], "linear_recurrent_state_shape": [4, 8, 6]}  # fmt: skip
    shape = CacheShape.from_config(config)
    assert (shape.attention_layers, shape.conv_state, shape.recurrent_state) == ([3], (56, 3), (4, 8, 6))


def test_a_decoder_whose_layers_caches_differ_gets_each_layers_own_or_none() -> None:
    """Gemma 4: wider heads and fewer key/value heads on the full-attention layers, and layers that read an earlier
    layer's cache keep none."""
    config = {"num_hidden_layers": 4, "num_key_value_heads": 2, "head_dim": 8, "torch_dtype": "float16",
              "kv_cache_layers": {"0": [2, 8], "1": [1, 16]}}  # fmt: skip
    shape = CacheShape.from_config(config)
    assert shape.attention_layers == [0, 1]
    feeds = empty_cache(shape, batch=3)
    assert {name: value.shape for name, value in feeds.items()} == {
        "past_key_values.0.key": (3, 2, 0, 8), "past_key_values.0.value": (3, 2, 0, 8),
        "past_key_values.1.key": (3, 1, 0, 16), "past_key_values.1.value": (3, 1, 0, 16),
    }  # fmt: skip
    assert bytes_per_cached_token(shape) == (2 * 2 * 8 + 2 * 1 * 16) * 2  # float16
