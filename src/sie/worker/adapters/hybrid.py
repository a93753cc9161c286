"""BGE-M3: dense, sparse and multi-vector representations from one forward pass, as FlagEmbedding's BGEM3FlagModel
computes them. Dense: the first token's state ([CLS]; `pooling` may say otherwise), L2-normalised unless `normalize`
is false. Sparse: `relu(sparse_linear(state))` of each token, the largest weight per token id, the tokenizer's special
tokens left out, over the vocabulary. Multi-vector: `colbert_linear(state)` of every real token after the first,
L2-normalised. The two heads are the checkpoint's `sparse_linear.pt` and `colbert_linear.pt` (torch zips, read
without torch); a checkpoint without them fails to load naming them. Scoring compares the dense vectors (cosine).
On a GPU the token states stay on the device: the dense vectors are pooled there and the two heads run there
(`device_pooling`), so only vectors and token weights come to the host.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Final

import numpy as np

from sie.catalog.adapters import HYBRID
from sie.tokenization import PaddedBatch
from sie.worker.adapters.base import AdapterContext
from sie.worker.adapters.encoder import EncodeSpec, TextEncoderAdapter, check_width, first_output, output_width
from sie.worker.adapters.feeds import bert_feeds
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.torch_zip import TorchZipFile
from sie.worker.device_pooling import DeviceTokenStates, device_pooling_for, head_rows, pooled_rows
from sie.worker.outputs import l2_normalize, quantize, sparse_dtype
from sie.worker.sentence_modules import DenseStage

SPARSE_HEAD: Final = "sparse_linear.pt"
COLBERT_HEAD: Final = "colbert_linear.pt"
# The heads' names where they run on the device (`device_pooling`).
SPARSE: Final = "sparse"
MULTIVECTOR: Final = "multivector"


def read_linear(path: Path, in_features: int | None, activation: str = "Identity") -> DenseStage:
    """A torch `Linear` state dict saved by `torch.save`, followed by `activation`; ValueError naming the file when
    it is missing or of another input width."""
    if not path.is_file():
        found = sorted(child.name for child in path.parent.iterdir()) if path.parent.is_dir() else []
        raise ValueError(f"BGE-M3 head {path.name} is not in {path.parent} (found {found})")
    try:
        state = TorchZipFile(path)
        weight, bias = state.load("weight"), state.load("bias")
    except ConversionError as exc:
        raise ValueError(str(exc)) from exc
    if weight.ndim != 2 or bias.shape != (weight.shape[0],) or (in_features and weight.shape[1] != in_features):
        raise ValueError(f"{path}: a Linear of {list(weight.shape)} does not fit the {in_features}-wide model")
    return DenseStage(np.ascontiguousarray(weight.T), bias, activation)


class HybridAdapter(TextEncoderAdapter):
    """`sie.adapters.hybrid` (the public `bge_m3*` modules): dense, sparse and multi-vector outputs; score is dense
    cosine."""

    kind: ClassVar[str | None] = HYBRID
    encode_outputs: ClassVar[tuple[str, ...]] = ("dense", "sparse", "multivector")

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        self._token_states = first_output(self.session, rank=3, preferred=("last_hidden_state", "token_embeddings"))
        hidden = output_width(self.session, self._token_states)
        directory = context.model_dir if context.model_dir is not None else Path(".")
        self._sparse = (read_linear(directory / SPARSE_HEAD, hidden, "ReLU"),)  # relu(sparse_linear(state))
        self._colbert = (read_linear(directory / COLBERT_HEAD, hidden),)
        self._special = np.fromiter(sorted(self.tokenizer.special_ids), dtype=np.int64)
        self.runtime_options.setdefault("pooling", "cls")
        self._device_pooling = device_pooling_for(
            self.session, self._token_states, context.device_graphs, {SPARSE: self._sparse, MULTIVECTOR: self._colbert}
        )
        check_width(self.model, "dense", hidden, "the model gives")
        check_width(self.model, "sparse", self.tokenizer.vocab_size, "the tokenizer gives")
        check_width(self.model, "multivector", self._colbert[0].out_features, "its colbert_linear gives")

    def forward(self, batch: PaddedBatch) -> list[np.ndarray | DeviceTokenStates]:
        """The batch's token states: a host array, or (on a GPU) left on the device, where the dense vectors are
        pooled and the heads run."""
        return [self.run_token_states(bert_feeds(batch), self._token_states, self._device_pooling)]

    def represent(self, outputs: list, batch: PaddedBatch, specs: list[EncodeSpec]) -> list[dict]:
        states = outputs[0]
        results = []
        for row, spec in enumerate(specs):
            result: dict = {}
            if "dense" in spec.output_types:
                result["dense"] = self._dense(states, batch, row, spec)
            if "sparse" in spec.output_types:
                result["sparse"] = self._sparse_vector(states, batch, row, spec)
            if "multivector" in spec.output_types:
                vectors = self._token_vectors(states, batch, row)
                result["multivector"] = {
                    "token_dims": int(vectors.shape[1]),
                    "num_tokens": int(vectors.shape[0]),
                    "dtype": spec.output_dtype,
                    "values": quantize(vectors, spec.output_dtype),
                }
            results.append(result)
        return results

    def _dense_vectors(self, states: np.ndarray | DeviceTokenStates, mask: np.ndarray, options: dict,
                       rows: list[int]) -> np.ndarray:  # fmt: skip
        """The dense vectors of `rows`, pooled under `mask` as `options` say."""
        vectors = pooled_rows(states, mask, str(options.get("pooling") or "cls"), rows)
        return l2_normalize(vectors) if options.get("normalize", True) else vectors

    def _dense(self, states: np.ndarray | DeviceTokenStates, batch: PaddedBatch, row: int, spec: EncodeSpec) -> dict:
        vector = self._dense_vectors(states, batch.attention_mask, spec.options, [row])[0]
        return {"dims": int(vector.shape[0]), "dtype": spec.output_dtype, "values": quantize(vector, spec.output_dtype)}

    def _sparse_vector(
        self, states: np.ndarray | DeviceTokenStates, batch: PaddedBatch, row: int, spec: EncodeSpec
    ) -> dict:
        """The largest relu(sparse_linear) weight of each token id among the row's real, non-special tokens."""
        ids = batch.input_ids[row]
        keep = (batch.attention_mask[row] == 1) & ~np.isin(ids, self._special)
        weights = head_rows(states, SPARSE, self._sparse, row, keep)[:, 0]
        ids = ids[keep]
        best = np.zeros(self.tokenizer.vocab_size, dtype=np.float32)
        np.maximum.at(best, ids, weights)
        indices = np.flatnonzero(best > 0).astype(np.int32)
        dtype = sparse_dtype(spec.output_dtype)
        values = quantize(best[indices], dtype)
        return {"dims": int(best.shape[0]), "dtype": dtype, "indices": indices, "values": values}

    def _token_vectors(self, states: np.ndarray | DeviceTokenStates, batch: PaddedBatch, row: int) -> np.ndarray:
        """colbert_linear of the real tokens after the first, L2-normalised."""
        length = int(batch.attention_mask[row].sum())
        return l2_normalize(head_rows(states, MULTIVECTOR, self._colbert, row, slice(1, length)))

    def similarities(self, outputs: list, batch: PaddedBatch, query: int, docs: range) -> np.ndarray:
        vectors = self._dense_vectors(outputs[0], batch.attention_mask, {"pooling": "cls"}, [query, *docs])
        return vectors[1:] @ vectors[0]
