"""A plain key/value-cache decode loop over a converted decoder graph (the names of `sie.worker.convert`): empty
caches, one prefill run over the prompt, then one run per new token, greedy. It is the raw onnxruntime baseline
that served generation is measured against (scripts/bench/generate.py) and the reference an adapter is tested
beside; it batches nothing and samples nothing. Blocking: call it from a worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from sie.worker.convert import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    POSITION_IDS,
    past_key_name,
    past_value_name,
)

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
_PRESENT_PREFIX = "present."
_PAST_PREFIX = "past_key_values."


@attrs.frozen
class CacheShape:
    """What an empty key/value cache needs: layers, key/value heads, head size and the cache dtype."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: type[np.floating] = np.float32

    @classmethod
    def from_config(cls, config_json: Mapping[str, Any]) -> CacheShape:
        """From the converter's config.json (`torch_dtype` names the cache dtype)."""
        dtype = np.float16 if config_json.get("torch_dtype") == "float16" else np.float32
        return cls(
            layers=int(config_json["num_hidden_layers"]),
            kv_heads=int(config_json["num_key_value_heads"]),
            head_dim=int(config_json["head_dim"]),
            dtype=dtype,
        )


def empty_cache(shape: CacheShape, batch: int = 1) -> dict[str, np.ndarray]:
    """`past_key_values.{i}.key|value` feeds with no past: `[batch, kv_heads, 0, head_dim]`."""
    empty = np.zeros((batch, shape.kv_heads, 0, shape.head_dim), dtype=shape.dtype)
    feeds = {}
    for layer in range(shape.layers):
        feeds[past_key_name(layer)] = empty
        feeds[past_value_name(layer)] = empty
    return feeds


def next_cache(output_names: Sequence[str], outputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """A run's `present.*` outputs renamed as the next run's `past_key_values.*` feeds."""
    return {
        _PAST_PREFIX + name.removeprefix(_PRESENT_PREFIX): value
        for name, value in zip(output_names, outputs, strict=True)
        if name.startswith(_PRESENT_PREFIX)
    }


@attrs.frozen
class GreedyResult:
    """The new tokens (stop token excluded), why decoding ended, and its timings in seconds."""

    token_ids: tuple[int, ...]
    finish_reason: str
    first_token_seconds: float  # prefill until the first new token is known
    total_seconds: float

    @property
    def decode_tokens_per_second(self) -> float:
        """Decode runs after the prefill, per second: each one made a token (a stop token counts)."""
        steps = len(self.token_ids) - 1 if self.finish_reason == FINISH_LENGTH else len(self.token_ids)
        seconds = self.total_seconds - self.first_token_seconds
        return steps / seconds if steps > 0 and seconds > 0 else 0.0


def greedy_decode(
    session: Any, prompt_ids: Sequence[int], shape: CacheShape, max_new_tokens: int, stop_ids: Collection[int]
) -> GreedyResult:
    """Decode up to `max_new_tokens` tokens after `prompt_ids` with an onnxruntime session of the decoder graph,
    stopping early at any of `stop_ids`."""
    output_names = [output.name for output in session.get_outputs()]
    logits_index = output_names.index(LOGITS)
    input_ids = np.asarray([prompt_ids], dtype=np.int64)
    length = input_ids.shape[1]
    positions = np.arange(length, dtype=np.int64)[None, :]
    cache = empty_cache(shape)
    tokens: list[int] = []
    started = time.perf_counter()
    first_token_seconds = 0.0
    finish = FINISH_LENGTH
    for step in range(max_new_tokens):
        mask = np.ones((1, length), dtype=np.int64)
        feeds = {INPUT_IDS: input_ids, ATTENTION_MASK: mask, POSITION_IDS: positions, **cache}
        outputs = session.run(None, feeds)
        token = int(np.argmax(outputs[logits_index][0, -1]))
        if step == 0:
            first_token_seconds = time.perf_counter() - started
        if token in stop_ids:
            finish = FINISH_STOP
            break
        tokens.append(token)
        cache = next_cache(output_names, outputs)
        input_ids = np.asarray([[token]], dtype=np.int64)
        positions = np.asarray([[length]], dtype=np.int64)
        length += 1
    return GreedyResult(tuple(tokens), finish, first_token_seconds, time.perf_counter() - started)
