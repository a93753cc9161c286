"""ColBERT's late-interaction conventions, as its checkpoints were trained with them (ColBERT v2, PyLate): which
tokens a query or a document becomes, which token vectors an encode returns, and the projection to `token_dim`.

- Projection: a PyLate stack's Dense chain (`modules.json`: a Transformer then Dense modules, no Pooling), else a
  Stanford checkpoint's root `linear.weight` (ColBERT v2, answerai-colbert); applied to every returned vector,
  before the L2 normalisation.
- Markers (`query_prefix`, `doc_prefix`): a marker that is one vocabulary entry (the string as written, else
  without its surrounding spaces: `[unused0]`, `[Q] `) is inserted as that id after the first token, where PyLate
  puts it; any other prefix is text put before the item's text.
- Query expansion (`query_expansion`): a query is filled with the mask token up to its limit; the filled positions
  are not attended to, but their vectors are returned (ColBERT's query augmentation).
- Limits: queries keep `query_max_length` tokens, documents `doc_max_length` or `max_seq_length`, the smaller
  (marker included).
- Returned vectors: every attended token (and a query's expansion), less the tokenizer's special tokens when
  `skip_special_tokens` (the default), and for documents the single-character punctuation tokens when
  `doc_punctuation_skiplist`.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from sie.tokenization import PaddedBatch, TextTokenizer, TokenizedText
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.safetensors_io import Checkpoint
from sie.worker.sentence_modules import DenseStage, read_sentence_modules

MASK_TOKENS = ("[MASK]", "<mask>")
STANFORD_PROJECTION = "linear.weight"


@attrs.frozen
class Marker:
    """How a query or a document is marked: an id inserted after the first token, or text put before the text."""

    token_id: int | None = None
    text: str = ""


def resolve_marker(tokenizer: TextTokenizer, prefix: str) -> Marker:
    """The marker a configured prefix stands for (see the module docstring)."""
    for candidate in dict.fromkeys((prefix, prefix.strip())):
        if candidate and (token_id := tokenizer.token_to_id(candidate)) is not None:
            return Marker(token_id=token_id)
    return Marker(text=prefix)


def read_projection(model_dir: Path | None) -> tuple[DenseStage, ...]:
    """The checkpoint's projection of token vectors, in order; `()` when it has none."""
    if model_dir is None:
        return ()
    stack = read_sentence_modules(model_dir)
    if stack is not None and stack.pooling is None and stack.dense:
        return stack.dense
    try:
        checkpoint = Checkpoint(model_dir)
    except ConversionError:  # an ONNX-only model directory: no checkpoint to look in
        return ()
    if STANFORD_PROJECTION not in checkpoint:
        return ()
    weight = checkpoint.load(STANFORD_PROJECTION)
    bias = checkpoint.load("linear.bias") if "linear.bias" in checkpoint else None
    if weight.ndim != 2 or (bias is not None and bias.shape != (weight.shape[0],)):
        raise ValueError(f"{checkpoint.path}: linear.weight {list(weight.shape)} is not a projection matrix")
    return (DenseStage(np.ascontiguousarray(weight.T), bias, "Identity"),)


class LateInteraction:
    """One loaded model's conventions: how a text becomes the tokens the model reads, which positions return a
    vector, and the projection and normalisation of those vectors."""

    def __init__(
        self,
        tokenizer: TextTokenizer,
        options: Mapping[str, Any],
        projection: Sequence[DenseStage] = (),
        expands_queries: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        self.projection = tuple(projection)
        self.query_marker = resolve_marker(tokenizer, str(options.get("query_prefix") or ""))
        self.doc_marker = resolve_marker(tokenizer, str(options.get("doc_prefix") or ""))
        self.mask_id = next((i for token in MASK_TOKENS if (i := tokenizer.token_to_id(token)) is not None), None)
        self.expands_queries = bool(options.get("query_expansion", expands_queries)) and self.mask_id is not None
        specials = set(tokenizer.special_ids) if options.get("skip_special_tokens", True) else set()
        query_drop = specials - {self.mask_id} if self.expands_queries else specials
        punctuation: set[int] = set()
        if options.get("doc_punctuation_skiplist", False):
            ids = (tokenizer.token_to_id(character) for character in string.punctuation)
            punctuation = {token_id for token_id in ids if token_id is not None}
        self._query_drop = np.fromiter(sorted(query_drop), dtype=np.int64)
        self._doc_drop = np.fromiter(sorted(specials | punctuation), dtype=np.int64)

    def width(self, hidden_width: int) -> int:
        """The width of a returned vector for a transformer of `hidden_width`."""
        return self.projection[-1].out_features if self.projection else hidden_width

    def marked_text(self, text: str, is_query: bool) -> str:
        return (self.query_marker if is_query else self.doc_marker).text + text

    def fit(self, tokenized: TokenizedText, is_query: bool, limit: int) -> TokenizedText:
        """The tokens the model reads: the marker id inserted after the first token, all of it cut to `limit`."""
        marker = self.query_marker if is_query else self.doc_marker
        if marker.token_id is not None and len(tokenized):
            tokenized = self._tokenizer.prepared(
                np.insert(tokenized.input_ids, 1, marker.token_id),
                np.insert(tokenized.token_type_ids, 1, 0),
                tokenized.truncated,
            )
        return self._tokenizer.cut(tokenized, limit)

    def pad(self, tokens: Sequence[TokenizedText], expand_to: Sequence[int]) -> PaddedBatch:
        """Right-padded rows; a row with `expand_to[row]` above its length is filled with the mask token up to it,
        unattended (query expansion)."""
        lengths = [len(tokenized) for tokenized in tokens]
        width = max([*lengths, *expand_to], default=0)
        input_ids = np.full((len(tokens), width), self._tokenizer.pad_id, dtype=np.int64)
        attention_mask = np.zeros((len(tokens), width), dtype=np.int64)
        token_type_ids = np.zeros((len(tokens), width), dtype=np.int64)
        for row, (tokenized, length, expanded) in enumerate(zip(tokens, lengths, expand_to, strict=True)):
            input_ids[row, :length] = tokenized.input_ids
            attention_mask[row, :length] = 1
            token_type_ids[row, :length] = tokenized.token_type_ids
            if expanded > length and self.mask_id is not None:
                input_ids[row, length:expanded] = self.mask_id
        return PaddedBatch(input_ids, attention_mask, token_type_ids)

    def kept(self, batch: PaddedBatch, row: int, is_query: bool) -> np.ndarray:
        """Which positions of a row return a vector."""
        ids = batch.input_ids[row]
        keep = batch.attention_mask[row] == 1
        if is_query and self.expands_queries:
            keep |= ids == self.mask_id
        return keep & ~np.isin(ids, self._query_drop if is_query else self._doc_drop)
