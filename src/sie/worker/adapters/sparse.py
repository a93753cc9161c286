"""SPLADE sparse embeddings: vocabulary weights log(1 + ReLU(logits)) max-pooled over tokens, as indices/values.

The MLM head allocates rows × sequence × vocabulary floats (30,522 per token for BERT), inside the graph when
it pools itself and as its output when it does not: 32 documents of 330 tokens are 1.3 GB. A batch runs in
slices whose logits stay under LOGITS_BUDGET_BYTES, each pooled before the next runs, so memory follows the
budget, not the batch (issue 13 §1).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar, Final

import numpy as np

from sie.catalog.adapters import SPARSE
from sie.tokenization import PaddedBatch
from sie.worker.adapters.base import AdapterContext
from sie.worker.adapters.encoder import EncodeSpec, TextEncoderAdapter, first_output
from sie.worker.adapters.feeds import bert_feeds
from sie.worker.outputs import quantize, sparse_dtype, sparse_rows

# Largest MLM logits tensor one run may produce; a batch above it runs in slices of rows. Measured on
# splade-tiny, 64 documents of 1.5 KB: peak RSS 328 MiB at 64 MiB, 1.2 GiB at 256 MiB, 5.2 GiB unsliced, no slower.
LOGITS_BUDGET_BYTES: Final = 64 * 2**20
_FLOAT32_BYTES: Final = 4


def rows_per_run(sequence_length: int, vocab_size: int, budget_bytes: int = LOGITS_BUDGET_BYTES) -> int:
    """How many rows of this padded length fit their logits in the budget (at least one)."""
    return max(1, budget_bytes // max(1, sequence_length * vocab_size * _FLOAT32_BYTES))


def row_slices(batch: PaddedBatch, rows: int) -> Iterator[PaddedBatch]:
    """The batch in slices of `rows` rows, each trimmed to its own longest row."""
    for start in range(0, batch.input_ids.shape[0], rows):
        mask = batch.attention_mask[start : start + rows]
        longest = int(mask.sum(axis=1).max()) if mask.size else 0
        yield PaddedBatch(
            input_ids=batch.input_ids[start : start + rows, :longest],
            attention_mask=mask[:, :longest],
            token_type_ids=batch.token_type_ids[start : start + rows, :longest],
        )


def splade_pool(logits: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """`[B,S,V]` MLM logits → `[B,V]` SPLADE weights, padding positions masked out."""
    weights = np.log1p(np.maximum(logits, 0.0)) * attention_mask[:, :, None]
    return weights.max(axis=1)


class SpladeAdapter(TextEncoderAdapter):
    """`sie.adapters.sparse`: sparse vectors with `dims` = vocabulary size; score is the sparse dot product."""

    kind: ClassVar[str | None] = SPARSE
    encode_outputs: ClassVar[tuple[str, ...]] = ("sparse",)

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        names = {node.name for node in self.session.get_outputs()}
        self._pooled = "sparse_embedding" in names
        self._output = "sparse_embedding" if self._pooled else first_output(self.session, rank=3, preferred=("logits",))
        self._special = sorted(self.tokenizer.special_ids)

    def forward(self, batch: PaddedBatch) -> list[np.ndarray]:
        # Whether the graph pools itself or returns logits, it computes [rows, sequence, vocab] inside: slice.
        rows = rows_per_run(batch.input_ids.shape[1], self.tokenizer.vocab_size)
        pooled = []
        for part in row_slices(batch, rows):
            (output,) = self.run_session(bert_feeds(part), [self._output])
            pooled.append(output if self._pooled else splade_pool(output, part.attention_mask))
            del output  # the next slice reuses the memory
        return [pooled[0] if len(pooled) == 1 else np.concatenate(pooled)]

    def represent(self, outputs: list[np.ndarray], batch: PaddedBatch, specs: list[EncodeSpec]) -> list[dict]:
        dims = int(outputs[0].shape[1])
        results = []
        for (indices, values), spec in zip(sparse_rows(outputs[0], self._special), specs, strict=True):
            dtype = sparse_dtype(spec.output_dtype)
            results.append(
                {"sparse": {"dims": dims, "dtype": dtype, "indices": indices, "values": quantize(values, dtype)}}
            )
        return results

    def similarities(self, outputs: list[np.ndarray], batch: PaddedBatch, query: int, docs: range) -> np.ndarray:
        weights = outputs[0].copy()
        weights[:, self._special] = 0.0
        return weights[list(docs)] @ weights[query]
