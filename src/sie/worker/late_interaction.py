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
  `doc_punctuation_skiplist` and the ids of `doc_skip_ids`.

TopK-Embed checkpoints (a Qwen3.5 language model with a `head.weight` projection) carry their own recipe in
`config.json` (`query_template`, `document_prompt`, `scoring_skip_ids`, `output_dim`) and `sentence_bert_config.json`
(`query_length`, `document_length`); `checkpoint_recipe` reads it as these options: the prompts are text before the
text (`prefix_as_text`; a query's text stripped first, a document's prompt and text stripped together:
`strip_text`), nothing skipped but a document's `scoring_skip_ids`, the projection cut to `output_dim` outputs.
"""

from __future__ import annotations

import json
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
SENTENCE_CONFIG_FILE = "sentence_bert_config.json"
TOPK_PROJECTION = "head.weight"  # TopK-Embed's, beside its backbone's `model.*` tensors
# TopK-Embed's config.json keys (its remote code's) and its reference adapter's defaults.
TOPK_KEYS = ("query_template", "document_prompt", "scoring_skip_ids", "output_dim")
TOPK_QUERY_PROMPT, TOPK_DOCUMENT_PROMPT = "Query: ", "Document: "
TOPK_QUERY_LENGTH, TOPK_DOCUMENT_LENGTH = 1024, 8192


@attrs.frozen
class Marker:
    """How a query or a document is marked: an id inserted after the first token, or text put before the text."""

    token_id: int | None = None
    text: str = ""


def resolve_marker(tokenizer: TextTokenizer, prefix: str, as_text: bool = False) -> Marker:
    """The marker a configured prefix stands for (see the module docstring); text, whatever the vocabulary holds,
    when `as_text`."""
    if as_text:
        return Marker(text=prefix)
    for candidate in dict.fromkeys((prefix, prefix.strip())):
        if candidate and (token_id := tokenizer.token_to_id(candidate)) is not None:
            return Marker(token_id=token_id)
    return Marker(text=prefix)


def checkpoint_recipe(config_json: Mapping[str, Any], model_dir: Path | None) -> dict[str, Any]:
    """The late-interaction options a TopK-Embed checkpoint's own files set ({} for any other checkpoint); a
    profile's options win over them."""
    if not any(key in config_json for key in TOPK_KEYS):
        return {}
    sentence_file = model_dir / SENTENCE_CONFIG_FILE if model_dir is not None else None
    sentence_config = json.loads(sentence_file.read_text()) if sentence_file and sentence_file.is_file() else {}
    return {
        "query_prefix": config_json.get("query_template", TOPK_QUERY_PROMPT),
        "doc_prefix": config_json.get("document_prompt", TOPK_DOCUMENT_PROMPT),
        "prefix_as_text": True,
        "strip_text": True,
        "skip_special_tokens": False,
        "doc_skip_ids": list(config_json.get("scoring_skip_ids") or ()),
        "query_max_length": int(sentence_config.get("query_length", TOPK_QUERY_LENGTH)),
        "doc_max_length": int(sentence_config.get("document_length", TOPK_DOCUMENT_LENGTH)),
    }


def read_projection(model_dir: Path | None, outputs: int | None = None) -> tuple[DenseStage, ...]:
    """The checkpoint's projection of token vectors, in order; `()` when it has none. `outputs` keeps the first so
    many of a TopK-Embed head's (its `output_dim`: Matryoshka)."""
    if model_dir is None:
        return ()
    stack = read_sentence_modules(model_dir)
    if stack is not None and stack.pooling is None and stack.dense:
        return stack.dense
    try:
        checkpoint = Checkpoint(model_dir)
    except ConversionError:  # an ONNX-only model directory: no checkpoint to look in
        return ()
    if TOPK_PROJECTION in checkpoint:
        head = checkpoint.load(TOPK_PROJECTION)
        if head.ndim != 2 or not 0 < (outputs or head.shape[0]) <= head.shape[0]:
            raise ValueError(f"{checkpoint.path}: head.weight {list(head.shape)} cannot give {outputs} outputs")
        return (DenseStage(np.ascontiguousarray(head[: outputs or head.shape[0]].T), None, "Identity"),)
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
        as_text = bool(options.get("prefix_as_text", False))
        self.query_marker = resolve_marker(tokenizer, str(options.get("query_prefix") or ""), as_text)
        self.doc_marker = resolve_marker(tokenizer, str(options.get("doc_prefix") or ""), as_text)
        self._strips = bool(options.get("strip_text", False))
        self.mask_id = next((i for token in MASK_TOKENS if (i := tokenizer.token_to_id(token)) is not None), None)
        self.expands_queries = bool(options.get("query_expansion", expands_queries)) and self.mask_id is not None
        specials = set(tokenizer.special_ids) if options.get("skip_special_tokens", True) else set()
        query_drop = specials - {self.mask_id} if self.expands_queries else specials
        punctuation: set[int] = set()
        if options.get("doc_punctuation_skiplist", False):
            ids = (tokenizer.token_to_id(character) for character in string.punctuation)
            punctuation = {token_id for token_id in ids if token_id is not None}
        self._query_drop = np.fromiter(sorted(query_drop), dtype=np.int64)
        listed = {int(token_id) for token_id in options.get("doc_skip_ids") or ()}
        self._doc_drop = np.fromiter(sorted(specials | punctuation | listed), dtype=np.int64)

    def width(self, hidden_width: int) -> int:
        """The width of a returned vector for a transformer of `hidden_width`."""
        return self.projection[-1].out_features if self.projection else hidden_width

    def marked_text(self, text: str, is_query: bool) -> str:
        if not self._strips:
            return (self.query_marker if is_query else self.doc_marker).text + text
        if is_query:  # TopK-Embed's: the query stripped, the document's prompt and text stripped together
            return self.query_marker.text + text.strip()
        return (self.doc_marker.text + text).strip()

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
