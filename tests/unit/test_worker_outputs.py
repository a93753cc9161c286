"""Output post-processing: the contract's worked dtype vector, pooling and sparse extraction."""

from __future__ import annotations

import numpy as np
import pytest

from sie.worker.outputs import l2_normalize, pool, quantize, sparse_dtype, sparse_rows

WORKED = np.array([[0.5, -1.0, 2.0]], dtype=np.float32)


@pytest.mark.parametrize(
    ("dtype", "expected", "numpy_dtype"),
    [
        ("int8", [32, -64, 127], np.int8),
        ("uint8", [128, 0, 255], np.uint8),
        ("binary", [160], np.uint8),
        ("ubinary", [160], np.uint8),
        ("float16", [0.5, -1.0, 2.0], np.float16),
        ("float32", [0.5, -1.0, 2.0], np.float32),
    ],
)
def test_worked_vector(dtype: str, expected: list, numpy_dtype) -> None:
    result = quantize(WORKED, dtype)
    assert result.dtype == numpy_dtype
    assert result[0].tolist() == expected


def test_quantisation_is_per_row_and_handles_constant_rows() -> None:
    rows = np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.5, -1.0, 2.0]], dtype=np.float32)
    assert quantize(rows, "int8").tolist() == [[0, 0, 0], [127, 127, 127], [32, -64, 127]]
    assert quantize(rows, "uint8")[:2].tolist() == [[128, 128, 128], [128, 128, 128]]


def test_binary_pads_to_whole_bytes() -> None:
    vector = np.ones((1, 10), dtype=np.float32)
    assert quantize(vector, "binary").tolist() == [[255, 192]]


def test_unknown_dtype() -> None:
    with pytest.raises(ValueError, match="output_dtype 'int4'"):
        quantize(WORKED, "int4")


def test_sparse_never_below_float16() -> None:
    assert [sparse_dtype(d) for d in ("int8", "uint8", "binary", "float16", "float32")] == [
        "float32", "float32", "float32", "float16", "float32",
    ]  # fmt: skip


def test_mean_pool_ignores_padding() -> None:
    hidden = np.array([[[1.0, 1.0], [3.0, 3.0], [100.0, 100.0]]], dtype=np.float32)
    mask = np.array([[1, 1, 0]])
    assert pool(hidden, mask, "mean").tolist() == [[2.0, 2.0]]
    assert pool(hidden, mask, "cls").tolist() == [[1.0, 1.0]]
    assert pool(hidden, mask, "last").tolist() == [[3.0, 3.0]]
    with pytest.raises(ValueError, match="pooling"):
        pool(hidden, mask, "max")


def test_l2_normalize_keeps_zero_vectors() -> None:
    result = l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32))
    assert np.allclose(result, [[0.6, 0.8], [0.0, 0.0]])


def test_sparse_rows_drop_zeros_and_excluded_ids() -> None:
    weights = np.array([[0.0, 1.5, 0.0, 2.0], [3.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    (first_idx, first_val), (second_idx, _) = sparse_rows(weights, excluded_ids=[3])
    assert first_idx.tolist() == [1] and first_val.tolist() == [1.5]
    assert second_idx.dtype == np.int32 and second_idx.tolist() == [0]
    assert weights[0, 3] == 2.0  # the caller's array is untouched
