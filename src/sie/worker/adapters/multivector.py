"""Multi-vector embeddings: one L2-normalised vector per real token (special and padding tokens dropped)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from sie.catalog.adapters import MULTIVECTOR
from sie.tokenization import PaddedBatch
from sie.worker.adapters.base import AdapterContext
from sie.worker.adapters.encoder import EncodeSpec, TextEncoderAdapter, check_width, first_output, output_width
from sie.worker.adapters.feeds import bert_feeds
from sie.worker.outputs import l2_normalize, quantize


class MultivectorAdapter(TextEncoderAdapter):
    """`sie.adapters.multivector`: token vectors per text; score is MaxSim (sum over query tokens of the best match)."""

    kind: ClassVar[str | None] = MULTIVECTOR
    encode_outputs: ClassVar[tuple[str, ...]] = ("multivector",)

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        self._token_states = first_output(self.session, rank=3, preferred=("last_hidden_state", "token_embeddings"))
        self._special = self.tokenizer.special_id_array
        # A ColBERT checkpoint served without its projection gives hidden-size token vectors: refused, not served.
        check_width(self.model, "multivector", output_width(self.session, self._token_states), "the graph gives")

    def forward(self, batch: PaddedBatch) -> list[np.ndarray]:
        return self.run_session(bert_feeds(batch), [self._token_states])

    def _token_vectors(self, hidden: np.ndarray, batch: PaddedBatch, row: int) -> np.ndarray:
        keep = (batch.attention_mask[row] == 1) & ~np.isin(batch.input_ids[row], self._special)
        return l2_normalize(hidden[row][keep])

    def represent(self, outputs: list[np.ndarray], batch: PaddedBatch, specs: list[EncodeSpec]) -> list[dict]:
        results = []
        for row, spec in enumerate(specs):
            vectors = self._token_vectors(outputs[0], batch, row)
            results.append(
                {
                    "multivector": {
                        "token_dims": int(vectors.shape[1]),
                        "num_tokens": int(vectors.shape[0]),
                        "dtype": spec.output_dtype,
                        "values": quantize(vectors, spec.output_dtype),
                    }
                }
            )
        return results

    def similarities(self, outputs: list[np.ndarray], batch: PaddedBatch, query: int, docs: range) -> np.ndarray:
        query_vectors = self._token_vectors(outputs[0], batch, query)
        scores = []
        for row in docs:
            doc_vectors = self._token_vectors(outputs[0], batch, row)
            best = (query_vectors @ doc_vectors.T).max(axis=1) if doc_vectors.size else np.zeros(len(query_vectors))
            scores.append(float(best.sum()))
        return np.asarray(scores, dtype=np.float32)
