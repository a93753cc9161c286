"""The key/value cache of a converted decoder graph (the names of `sie.worker.convert.names`): its CacheShape (from
the converter's config.json), empty caches, a run's `present.*` outputs as the next run's `past_key_values.*` feeds,
and BatchCache, the running rows' cache left-padded to one length with the mask of their real positions, with the
feeds of one prefill or decode step. A hybrid decoder's linear-attention layers (Qwen3.5) keep two fixed-size states
per row instead of keys and values: rows join and leave with them, nothing to pad. Pure numpy, no threads: a cache a
run left on its device (an onnxruntime OrtValue, `decoder_run.py`) passes through a decode step as it is, and comes
to the host (its `numpy()`) only when rows join or leave.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from sie.worker.convert.names import (
    ATTENTION_MASK,
    CONV_STATE,
    CONV_STATE_SHAPE,
    INPUT_IDS,
    KV_CACHE_LAYERS,
    LINEAR_ATTENTION_LAYERS,
    PAST_PREFIX,
    POSITION_IDS,
    PRESENT_PREFIX,
    RECURRENT_STATE,
    RECURRENT_STATE_SHAPE,
    is_state_name,
    past_key_name,
    past_state_name,
    past_value_name,
)


@attrs.frozen
class CacheShape:
    """What an empty key/value cache needs: layers, key/value heads, head size and the cache dtype; for a hybrid
    decoder (Qwen3.5), which layers are linear-attention ones and the per-row shapes of their two states (float32);
    for one whose layers' caches differ or are shared (Gemma 4), each caching layer's shape."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: type[np.floating] = np.float32
    state_layers: tuple[int, ...] = ()
    conv_state: tuple[int, ...] = ()  # [channels, conv_kernel - 1]
    recurrent_state: tuple[int, ...] = ()  # [value_heads, key_dim, value_dim]
    # where layers' caches differ (Gemma 4): each caching layer's (kv_heads, head_dim); a layer left out keeps none
    layer_caches: Mapping[int, tuple[int, int]] = attrs.field(factory=dict)

    @classmethod
    def from_config(cls, config_json: Mapping[str, Any]) -> CacheShape:
        """From the converter's config.json (`torch_dtype` names the cache dtype)."""
        dtype = np.float16 if config_json.get("torch_dtype") == "float16" else np.float32
        states: dict[str, Any] = {}
        if config_json.get(LINEAR_ATTENTION_LAYERS):
            states = {"state_layers": tuple(config_json[LINEAR_ATTENTION_LAYERS]),
                      "conv_state": tuple(config_json[CONV_STATE_SHAPE]),
                      "recurrent_state": tuple(config_json[RECURRENT_STATE_SHAPE])}  # fmt: skip
        if config_json.get(KV_CACHE_LAYERS):
            states["layer_caches"] = {int(layer): (int(heads), int(size))
                                      for layer, (heads, size) in config_json[KV_CACHE_LAYERS].items()}  # fmt: skip
        return cls(
            layers=int(config_json["num_hidden_layers"]),
            kv_heads=int(config_json["num_key_value_heads"]),
            head_dim=int(config_json["head_dim"]),
            dtype=dtype,
            **states,
        )

    @property
    def attention_layers(self) -> list[int]:
        """The layers with a key/value cache."""
        if self.layer_caches:
            return sorted(self.layer_caches)
        return [layer for layer in range(self.layers) if layer not in self.state_layers]

    def cache_of(self, layer: int) -> tuple[int, int]:
        """A caching layer's key/value heads and head size."""
        return self.layer_caches.get(layer, (self.kv_heads, self.head_dim))


def empty_cache(shape: CacheShape, batch: int = 1) -> dict[str, np.ndarray]:
    """`past_key_values.{i}.key|value` feeds with no past, `[batch, kv_heads, 0, head_dim]`, and a linear-attention
    layer's `past_key_values.{i}.conv|recurrent` states before any token: zeros."""
    feeds = {}
    for layer in shape.attention_layers:
        kv_heads, head_dim = shape.cache_of(layer)
        feeds[past_key_name(layer)] = feeds[past_value_name(layer)] = np.zeros((batch, kv_heads, 0, head_dim),
                                                                               dtype=shape.dtype)  # fmt: skip
    for layer in shape.state_layers:
        feeds[past_state_name(layer, CONV_STATE)] = np.zeros((batch, *shape.conv_state), dtype=np.float32)
        feeds[past_state_name(layer, RECURRENT_STATE)] = np.zeros((batch, *shape.recurrent_state), dtype=np.float32)
    return feeds


def next_cache(output_names: Sequence[str], outputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """A run's `present.*` outputs renamed as the next run's `past_key_values.*` feeds."""
    return {
        PAST_PREFIX + name.removeprefix(PRESENT_PREFIX): value
        for name, value in zip(output_names, outputs, strict=True)
        if name.startswith(PRESENT_PREFIX)
    }


def bytes_per_cached_token(shape: CacheShape) -> int:
    """Key and value cache bytes one token of one row holds, over every attention layer."""
    per_token = sum(2 * kv_heads * head_dim for kv_heads, head_dim in map(shape.cache_of, shape.attention_layers))
    return per_token * np.dtype(shape.dtype).itemsize


def bytes_per_row_state(shape: CacheShape) -> int:
    """The linear-attention states' bytes of one row, whatever its length (float32)."""
    per_layer = int(np.prod(shape.conv_state, dtype=np.int64)) + int(np.prod(shape.recurrent_state, dtype=np.int64))
    return len(shape.state_layers) * per_layer * np.dtype(np.float32).itemsize


def _host(value: Any) -> np.ndarray:
    """A cache tensor as a numpy array: itself, or a copy of a device-resident OrtValue."""
    return value if isinstance(value, np.ndarray) else value.numpy()


def _left_pad(array: np.ndarray, length: int, axis: int) -> np.ndarray:
    missing = length - array.shape[axis]
    if missing == 0:
        return array
    widths = [(0, 0)] * array.ndim
    widths[axis] = (missing, 0)
    return np.pad(array, widths)


@attrs.frozen
class BatchCache:
    """The running rows' key/value cache (`past_key_values.*`, `[rows, kv_heads, T, head_dim]`: numpy arrays, or
    OrtValues a run left on its device), left-padded to one length T, and the int64 mask `[rows, T]` of the
    positions that hold real tokens."""

    past: Mapping[str, Any]
    mask: np.ndarray

    @classmethod
    def empty(cls, shape: CacheShape) -> BatchCache:
        return cls(empty_cache(shape, batch=0), np.zeros((0, 0), dtype=np.int64))

    @staticmethod
    def prompt_feeds(prompts: Sequence[np.ndarray], shape: CacheShape) -> dict[str, np.ndarray]:
        """The decoder's inputs for one prefill of `prompts` together: left-padded to the longest, masked, each
        row's positions counting from its first real token, and empty caches."""
        width = max(len(prompt) for prompt in prompts)
        ids = np.zeros((len(prompts), width), dtype=np.int64)
        mask = np.zeros((len(prompts), width), dtype=np.int64)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = prompt
            mask[row, width - len(prompt) :] = 1
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        return {
            INPUT_IDS: ids,
            ATTENTION_MASK: mask,
            POSITION_IDS: positions,
            **empty_cache(shape, batch=len(prompts)),
        }

    @property
    def rows(self) -> int:
        return int(self.mask.shape[0])

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    def positions(self) -> np.ndarray:
        """`[rows, 1]`: each row's count of real tokens, the position of the token it feeds next (RoPE)."""
        return self.mask.sum(axis=1, keepdims=True).astype(np.int64)

    def join(self, other: BatchCache) -> BatchCache:
        """Both batches' rows (ours first), the shorter left-padded with zeros the mask leaves out."""
        if not self.rows:
            return other  # its cache stays where it is
        length = max(self.length, other.length)
        past = {
            name: np.concatenate([_host(value), _host(other.past[name])]) if is_state_name(name)
            else np.concatenate([_left_pad(_host(value), length, 2), _left_pad(_host(other.past[name]), length, 2)])
            for name, value in self.past.items()
        }  # fmt: skip
        mask = np.concatenate([_left_pad(self.mask, length, 1), _left_pad(other.mask, length, 1)])
        return BatchCache(past, mask)

    def keep(self, rows: Sequence[int]) -> BatchCache:
        """Only `rows`, in that order; the leading columns no kept row uses are dropped."""
        index = np.asarray(rows, dtype=np.int64)
        mask = self.mask[index]
        used = np.flatnonzero(mask.any(axis=0))
        start = int(used[0]) if used.size else mask.shape[1]
        past = {
            name: np.ascontiguousarray(_host(value)[index] if is_state_name(name) else _host(value)[index, :, start:])
            for name, value in self.past.items()
        }
        return BatchCache(past, np.ascontiguousarray(mask[:, start:]))

    def step_feeds(self, last_tokens: Sequence[int]) -> dict[str, np.ndarray]:
        """The decoder's inputs for one step that feeds each row its last token."""
        return {
            INPUT_IDS: np.asarray(last_tokens, dtype=np.int64).reshape(self.rows, 1),
            POSITION_IDS: self.positions(),
            ATTENTION_MASK: self._stepped_mask(),
            **self.past,
        }

    def advanced(self, present: Mapping[str, np.ndarray]) -> BatchCache:
        """The batch after a step: the step's `present.*` caches (renamed `past_key_values.*`), one more column."""
        return BatchCache(present, self._stepped_mask())

    def _stepped_mask(self) -> np.ndarray:
        return np.concatenate([self.mask, np.ones((self.rows, 1), dtype=np.int64)], axis=1)
