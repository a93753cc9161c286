"""A plain key/value-cache decode loop over a converted decoder graph: empty caches, one prefill run over the prompt,
then one run per new token, greedy. It is the raw reference: the onnxruntime baseline that served generation is
measured against (scripts/bench/generate.py) and that the batching decoder is tested beside; it batches nothing and
samples nothing. Blocking: call it from a worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any

import attrs
import numpy as np

from sie.wire.generate import FINISH_LENGTH, FINISH_STOP
from sie.worker.convert.names import ATTENTION_MASK, INPUT_IDS, LOGITS, POSITION_IDS
from sie.worker.generation.kv_cache import CacheShape, empty_cache, next_cache


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
