"""Batch post-processing with numpy: pooling, L2 normalisation, output dtypes and sparse extraction.

Everything works on whole batches (`[batch, ...]` arrays); dtype rules are contracts Part B §1.2.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from sie.catalog.options import POOLING_MODES
from sie.wire.http import OUTPUT_DTYPES

_SPARSE_ALLOWED = ("float32", "float16")


def pool(hidden: np.ndarray, attention_mask: np.ndarray, mode: str) -> np.ndarray:
    """Sentence vectors `[B,H]` from token states `[B,S,H]`: masked mean, first token, or last real token."""
    if mode == "cls":
        return hidden[:, 0, :]
    mask = attention_mask.astype(hidden.dtype)
    if mode in ("last", "last_token"):
        last = np.maximum(attention_mask.sum(axis=1) - 1, 0)
        return hidden[np.arange(hidden.shape[0]), last, :]
    if mode != "mean":
        raise ValueError(f"unknown pooling {mode!r}; expected one of {list(POOLING_MODES)}")
    summed = np.einsum("bsh,bs->bh", hidden, mask)
    counts = np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
    return summed / counts


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Unit length along the last axis; zero vectors stay zero."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def quantize(vectors: np.ndarray, dtype: str) -> np.ndarray:
    """Convert float vectors (per row along the last axis) to a public output dtype."""
    values = np.asarray(vectors, dtype=np.float32)
    if dtype == "float32":
        return values
    if dtype == "float16":
        return values.astype(np.float16)
    if dtype == "int8":
        scale = np.max(np.abs(values), axis=-1, keepdims=True)
        scaled = np.divide(values, scale, out=np.zeros_like(values), where=scale > 0) * 127.0
        return np.clip(np.rint(scaled), -127, 127).astype(np.int8)
    if dtype == "uint8":
        low = values.min(axis=-1, keepdims=True)
        span = values.max(axis=-1, keepdims=True) - low
        scaled = np.divide(values - low, span, out=np.full_like(values, 128.0 / 255.0), where=span > 0)
        return np.rint(scaled * 255.0).astype(np.uint8)
    if dtype in ("binary", "ubinary"):
        return np.packbits(values > 0, axis=-1)
    raise ValueError(f"unknown output_dtype {dtype!r}; expected one of {list(OUTPUT_DTYPES)}")


def sparse_dtype(dtype: str) -> str:
    """Sparse values are never quantised below float16: int8/uint8/binary requests stay float32."""
    return dtype if dtype in _SPARSE_ALLOWED else "float32"


def sparse_rows(weights: np.ndarray, excluded_ids: Iterable[int] = ()) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per row of `[B,V]` weights: (int32 indices, float32 values) of the non-zeros, excluded ids dropped."""
    weights = np.array(weights, dtype=np.float32, copy=True)
    excluded = np.fromiter(excluded_ids, dtype=np.int64)
    if excluded.size:
        weights[:, excluded[excluded < weights.shape[1]]] = 0.0
    rows = []
    for row in weights:
        indices = np.flatnonzero(row > 0).astype(np.int32)
        rows.append((indices, row[indices]))
    return rows
