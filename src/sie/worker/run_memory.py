"""What one onnxruntime run allocates, and keeping it bounded (issue 13 §1): an estimate of a transformer
run's activation memory from the model's config.json and the batch's shape, the slicing of a batch's feeds
into runs that fit SIE_WORKER_RUN_MEMORY_BYTES, and handing freed memory back to the operating system once the
worker goes idle after a large run (glibc keeps freed heap pages otherwise, so a process stays at its peak long
after it).

The estimate is deliberately conservative: per item, three attention-score tensors per head (scores, mask
sum, softmax; S x S floats each) plus the widest per-token activations (the feed-forward layer and a few
hidden-state copies). Measured on the 6-layer, 12-head rampart model at 512 tokens, a run peaks at about
30 MiB per item; the estimate says 45 MiB.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs
import numpy as np

logger = logging.getLogger(__name__)

FLOAT_BYTES: Final = 4
# Models whose config.json lacks a field get BERT-base's value.
DEFAULT_HEADS: Final = 12
DEFAULT_HIDDEN: Final = 768
# SIE_WORKER_RUN_MEMORY_BYTES' default.
DEFAULT_RUN_MEMORY_BYTES: Final = 256 * 1024 * 1024
# A run estimated above this leaves enough freed heap behind to hand back to the OS (a few milliseconds) once the
# worker is idle.
TRIM_AFTER_BYTES: Final = 64 * 1024 * 1024


@attrs.frozen
class RunMemory:
    """A model's activation footprint per token, from its config.json."""

    heads: int = DEFAULT_HEADS
    hidden: int = DEFAULT_HIDDEN
    intermediate: int = 4 * DEFAULT_HIDDEN

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RunMemory:
        """Read `num_attention_heads`, `hidden_size`, `intermediate_size` (or their common aliases)."""
        heads = _first_int(config, ("num_attention_heads", "n_head", "num_heads"), DEFAULT_HEADS)
        hidden = _first_int(config, ("hidden_size", "d_model", "n_embd", "dim"), DEFAULT_HIDDEN)
        intermediate = _first_int(config, ("intermediate_size", "hidden_dim", "d_ff", "n_inner"), 4 * hidden)
        return cls(heads, hidden, intermediate)

    def bytes_for(self, items: int, tokens: int) -> int:
        """Estimated peak activation bytes of one run over `items` rows of `tokens` tokens."""
        per_token = 3 * self.heads * tokens + 2 * self.intermediate + 4 * self.hidden
        return FLOAT_BYTES * items * tokens * per_token

    def rows_per_run(self, tokens: int, budget_bytes: int) -> int:
        """How many rows of `tokens` tokens one run may take within `budget_bytes` (at least one)."""
        return max(1, budget_bytes // max(1, self.bytes_for(1, tokens)))


def _load_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(name).malloc_trim
    return None


_malloc_trim = _load_trim()


def release_free_memory() -> None:
    """Give the heap's free pages back to the OS (glibc malloc_trim; a no-op where the C library lacks it)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


class FreedHeap:
    """Whether a large run has left freed memory in the process's heap since it was last handed back. The worker's
    batch runner trims once it has been idle a moment, not after every large run: a trim right after each batch made
    the next one fault all its pages in again (all-MiniLM-L6-v2 served at 32 clients x 128 tokens: 3.6 vs 1.2 ms of
    system CPU per text, ~8 % of the throughput), while under steady load the heap's pages are what the next batch
    reuses."""

    def __init__(self, release: Callable[[], None] = release_free_memory) -> None:
        self._release = release
        self.pending = False

    def note_large_run(self) -> None:
        self.pending = True

    def release(self) -> None:
        """Hand the freed pages back (on the thread that runs the model, between runs)."""
        self.pending = False
        self._release()


# The C heap is one per process, whichever adapter or runner freed into it.
PROCESS_HEAP: Final = FreedHeap()


Run = Callable[[Mapping[str, np.ndarray]], list[np.ndarray]]


def run_in_slices(
    run: Run, feeds: Mapping[str, np.ndarray], memory: RunMemory, budget_bytes: int, heap: FreedHeap = PROCESS_HEAP
) -> list[np.ndarray]:
    """`run(feeds)`, or, when the batch's estimate is over `budget_bytes`, `run` over row slices of the feeds
    with the outputs concatenated in order (each row's result is the same: rows do not interact). Feeds are
    [rows, tokens, ...] arrays; a batch without one is run whole. A large batch leaves `heap` a trim to make."""
    parts = run_slices(run, feeds, memory, budget_bytes, heap)
    if len(parts) == 1:
        return parts[0]
    outputs = [np.concatenate([part[index] for part in parts]) for index in range(len(parts[0]))]
    del parts
    return outputs


def run_slices(
    run: Callable[[Mapping[str, np.ndarray]], list[Any]],
    feeds: Mapping[str, np.ndarray],
    memory: RunMemory,
    budget_bytes: int,
    heap: FreedHeap = PROCESS_HEAP,
) -> list[list[Any]]:
    """Each run's outputs, in row order: `[run(feeds)]`, or one per row slice of the feeds when the batch's
    estimate is over `budget_bytes` (the outputs need not be host arrays: `device_pooling` leaves them on a GPU)."""
    rows, tokens = _batch_shape(feeds)
    estimate = memory.bytes_for(rows, tokens)
    if estimate <= budget_bytes or rows <= 1:
        parts = [run(feeds)]
    else:
        step = memory.rows_per_run(tokens, budget_bytes)
        parts = [run(_rows(feeds, start, start + step)) for start in range(0, rows, step)]
    if estimate > TRIM_AFTER_BYTES:
        heap.note_large_run()
    return parts


def _rows(feeds: Mapping[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    return {name: value[start:stop] for name, value in feeds.items()}


def _batch_shape(feeds: Mapping[str, np.ndarray]) -> tuple[int, int]:
    for value in feeds.values():
        if value.ndim >= 2:
            return int(value.shape[0]), int(value.shape[1])
    return 1, 0


def _first_int(config: Mapping[str, Any], keys: Sequence[str], default: int) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default
