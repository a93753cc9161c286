"""SPLADE sparse embeddings: vocabulary weights log(1 + ReLU(logits)) max-pooled over tokens, as indices/values.

Inference-free models (OpenSearch's `doc-*` sparse encoders) ship the weight of each query token (`idf.json`, or
`query_token_weights.txt`): their queries are not run through the model but weigh each distinct token of the query by
that table, as OpenSearch encodes them; documents go through the model. The public `gte_sparse_flash` module's model
(opensearch doc-v3-gte), and a sentence-transformers stack whose `SpladePooling` says `log1p_relu`, take one more
log: log(1 + log(1 + ReLU(logits))); a stack that pools by sum is converted with a summing head (its log taken
per token, inside the graph).

The MLM head allocates rows × sequence × vocabulary floats (30,522 per token for BERT), inside the graph when
it pools itself and as its output when it does not: 32 documents of 330 tokens are 1.3 GB. A batch runs in
slices whose logits stay under LOGITS_BUDGET_BYTES, each pooled before the next runs, so memory follows the
budget, not the batch (issue 13 §1).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar, Final

import attrs
import numpy as np

from sie.catalog.adapters import SPARSE
from sie.tokenization import PaddedBatch, TextTokenizer
from sie.worker.adapters.base import AdapterContext, ItemResult, Stopwatch
from sie.worker.adapters.encoder import EncodeSpec, TextEncoderAdapter, first_output
from sie.worker.adapters.feeds import bert_feeds
from sie.worker.outputs import quantize, sparse_dtype, sparse_rows

# Largest MLM logits tensor one run may produce; a batch above it runs in slices of rows. Measured on
# splade-tiny, 64 documents of 1.5 KB: peak RSS 328 MiB at 64 MiB, 1.2 GiB at 256 MiB, 5.2 GiB unsliced, no slower.
LOGITS_BUDGET_BYTES: Final = 64 * 2**20
_FLOAT32_BYTES: Final = 4
QUERY_WEIGHT_FILES: Final = ("query_token_weights.txt", "idf.json")
# Public modules whose model takes log(1 + ...) twice (opensearch doc-v3-gte, as the public adapter serves it).
DOUBLE_LOG_MODULES: Final = frozenset({"sie_server.adapters.gte_sparse_flash"})


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


def read_query_weights(model_dir: Path | None, tokenizer: TextTokenizer) -> np.ndarray | None:
    """The weight of each vocabulary id for inference-free queries ([vocab], special tokens 0) from the first of
    QUERY_WEIGHT_FILES in `model_dir`; None when it has neither. ValueError naming a file that cannot be read."""
    for name in QUERY_WEIGHT_FILES:
        path = model_dir / name if model_dir is not None else None
        if path is None or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
            if name.endswith(".json"):
                table = {str(token): float(weight) for token, weight in json.loads(text).items()}
            else:
                rows = (line.split("\t") for line in text.splitlines() if line.strip())
                table = {token: float(weight) for token, weight in rows}
        except (OSError, ValueError, AttributeError) as exc:
            raise ValueError(f"{path}: not a table of token weights: {exc}") from exc
        weights = np.zeros(tokenizer.vocab_size, dtype=np.float32)
        for token, weight in table.items():
            token_id = tokenizer.token_to_id(token)
            if token_id is not None and token_id < len(weights) and math.isfinite(weight):
                weights[token_id] = weight
        weights[sorted(tokenizer.special_ids)] = 0.0
        return weights
    return None


@attrs.frozen
class SpladeStack:
    """How a sentence-transformers SPLADE stack pools (`SpladePooling`): `strategy` `max` or `sum` over the tokens,
    `activation` `relu` (log1p(relu)) or `log1p_relu` (one more log1p). Without such a module: max and relu."""

    strategy: str = "max"
    activation: str = "relu"

    @property
    def conversion_head(self) -> str:
        """The ONNX head that pools as the stack does (heads.py): a sum takes its activation inside the graph."""
        if self.strategy == "max":
            return "mlm-splade"
        return "mlm-splade-sum-log1p" if self.activation == "log1p_relu" else "mlm-splade-sum"


def read_splade_stack(model_dir: Path | None) -> SpladeStack:
    """The SpladePooling module of `model_dir`'s modules.json; ValueError naming a strategy or activation that is
    not built, or a module that cannot be read."""
    modules = model_dir / "modules.json" if model_dir is not None else None
    if modules is None or not modules.is_file():
        return SpladeStack()
    try:
        entries = json.loads(modules.read_text(encoding="utf-8"))
        entry = next((e for e in entries if str(e.get("type", "")).endswith("SpladePooling")), None)
        if entry is None:
            return SpladeStack()
        config_path = model_dir / str(entry.get("path", "")) / "config.json"  # type: ignore[operator]
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise ValueError(f"{modules}: cannot read the SpladePooling module: {exc}") from exc
    strategy = config.get("pooling_strategy", "max")
    if strategy not in ("max", "sum"):
        raise ValueError(f"{config_path}: SpladePooling pooling_strategy {strategy!r} is not built (max or sum)")
    activation = config.get("activation_function", "relu")
    if activation not in ("relu", "log1p_relu"):
        raise ValueError(f"{config_path}: SpladePooling activation_function {activation!r} is not built")
    return SpladeStack(str(strategy), str(activation))


def weigh_query(weights: np.ndarray, input_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An inference-free query: each distinct token id with its table weight, those above zero."""
    ids = np.unique(input_ids[input_ids < len(weights)])
    values = weights[ids]
    keep = values > 0
    return ids[keep].astype(np.int32), values[keep]


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
        self._query_weights = read_query_weights(context.model_dir, self.tokenizer)
        stack = read_splade_stack(context.model_dir)
        # A max commutes with log1p, so the second log of a max-pooled stack is taken here; a summing graph took it.
        double_log = self.profile.adapter_module in DOUBLE_LOG_MODULES or stack.activation == "log1p_relu"
        self._double_log = double_log and stack.strategy == "max"
        if stack.strategy == "sum" and not self._pooled:
            raise ValueError("a SpladePooling('sum') stack needs its graph to pool (onnx_head mlm-splade-sum)")

    def _encode_runnable(self, runnable: list, results: list[ItemResult], watch: Stopwatch) -> None:
        """Queries of an inference-free model are weighed by its table; everything else runs the model."""
        if self._query_weights is not None:
            with watch.stage("postprocessing"):
                for index, spec, tokenized in runnable:
                    if spec.is_query:
                        result = self._sparse_result(*weigh_query(self._query_weights, tokenized.input_ids), spec)
                        results[index] = ItemResult(result=result, input_tokens=len(tokenized))
            runnable = [entry for entry in runnable if not entry[1].is_query]
        if runnable:
            super()._encode_runnable(runnable, results, watch)

    def _sparse_result(self, indices: np.ndarray, values: np.ndarray, spec: EncodeSpec) -> dict:
        dtype = sparse_dtype(spec.output_dtype)
        dims = self.tokenizer.vocab_size if self._query_weights is None else len(self._query_weights)
        return {"sparse": {"dims": dims, "dtype": dtype, "indices": indices, "values": quantize(values, dtype)}}

    def forward(self, batch: PaddedBatch) -> list[np.ndarray]:
        # Whether the graph pools itself or returns logits, it computes [rows, sequence, vocab] inside: slice.
        rows = rows_per_run(batch.input_ids.shape[1], self.tokenizer.vocab_size)
        pooled = []
        for part in row_slices(batch, rows):
            (output,) = self.run_session(bert_feeds(part), [self._output])
            pooled.append(output if self._pooled else splade_pool(output, part.attention_mask))
            del output  # the next slice reuses the memory
        weights = pooled[0] if len(pooled) == 1 else np.concatenate(pooled)
        return [np.log1p(weights) if self._double_log else weights]

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
        if self._query_weights is None:
            return weights[list(docs)] @ weights[query]
        ids, values = weigh_query(self._query_weights, batch.input_ids[query][batch.attention_mask[query] == 1])
        return weights[list(docs)][:, ids] @ values
