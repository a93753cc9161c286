"""SPLADE sparse embeddings: vocabulary weights log(1 + ReLU(logits)) max-pooled over tokens, as indices/values."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from sie.tokenization import PaddedBatch
from sie.worker.adapters.base import AdapterContext
from sie.worker.adapters.encoder import EncodeSpec, TextEncoderAdapter, first_output
from sie.worker.adapters.feeds import bert_feeds
from sie.worker.outputs import quantize, sparse_dtype, sparse_rows


def splade_pool(logits: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """`[B,S,V]` MLM logits → `[B,V]` SPLADE weights, padding positions masked out."""
    weights = np.log1p(np.maximum(logits, 0.0)) * attention_mask[:, :, None]
    return weights.max(axis=1)


class SpladeAdapter(TextEncoderAdapter):
    """`sie.adapters.sparse`: sparse vectors with `dims` = vocabulary size; score is the sparse dot product."""

    encode_outputs: ClassVar[tuple[str, ...]] = ("sparse",)

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        names = {node.name for node in self.session.get_outputs()}
        self._pooled = "sparse_embedding" in names
        self._output = "sparse_embedding" if self._pooled else first_output(self.session, rank=3, preferred=("logits",))
        self._special = sorted(self.tokenizer.special_ids)

    def forward(self, batch: PaddedBatch) -> list[np.ndarray]:
        (output,) = self.run_session(bert_feeds(batch), [self._output])
        return [output if self._pooled else splade_pool(output, batch.attention_mask)]

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
