"""Bi-encoder adapters share this: per-item checks, text preparation, one forward pass per batch,
and query/document scoring by comparing their representations (dense cosine, sparse dot, MaxSim).
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final

import attrs
import numpy as np

from sie.tokenization import (
    INSTRUCTION_PLACEHOLDER,
    PaddedBatch,
    TokenizedText,
    length_groups,
    pad_batch,
    prepare_text,
)
from sie.wire import codes
from sie.wire.ipc_batch import OP_ENCODE, OP_SCORE
from sie.worker.adapters.base import Adapter, BatchResult, ItemResult, Stopwatch, invalid


@attrs.frozen
class EncodeSpec:
    """What one encode item asks for, after validation."""

    text: str
    output_types: tuple[str, ...]
    output_dtype: str
    options: dict[str, Any]
    is_query: bool = False
    prepared: TokenizedText | None = None
    prefix: str = ""  # what the template and instruction put before the text (read where `skips_prefix`)


IMAGES_NOT_SERVED: Final = "Item has images; this model reads text only (its image inputs are not served)"


def item_text(item: dict[str, Any] | None) -> str | None:
    text = (item or {}).get("text")
    return text if isinstance(text, str) else None


def has_images(*items: dict[str, Any] | None) -> bool:
    """Whether any of the items carries images (a text model refuses it rather than reading its text alone)."""
    return any((item or {}).get("images") for item in items)


def ranked_scores(scores: Sequence[float], items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`[{item_id, score, rank}]` sorted by score descending; ids default to `item-{i}` (contracts §1.3)."""
    rows = [
        {"item_id": (item or {}).get("id") or f"item-{index}", "score": float(score)}
        for index, (score, item) in enumerate(zip(scores, items, strict=True))
    ]
    rows.sort(key=lambda row: row["score"], reverse=True)
    for rank, row in enumerate(rows):
        row["rank"] = rank
    return rows


class TextEncoderAdapter(Adapter, metaclass=ABCMeta):
    """Encodes texts with one forward pass; subclasses turn model outputs into their representation."""

    supports_score: ClassVar[bool] = True
    # Whether the representation leaves out the tokens a row's template and instruction put before its text (NV-Embed
    # pools so): `represent` and `similarities` then read a batch whose mask has them cleared (`read_batch`).
    skips_prefix: bool = False

    def encode(self, items: Sequence[Any]) -> BatchResult:
        watch = Stopwatch()
        specs = [self._encode_spec(item) for item in items]
        valid = [index for index, spec in enumerate(specs) if isinstance(spec, EncodeSpec)]
        results: list[ItemResult] = [spec if isinstance(spec, ItemResult) else ItemResult() for spec in specs]
        if valid:
            chosen = [specs[index] for index in valid]
            with watch.stage("tokenization"):
                tokens = self._tokens(chosen)
            for index, spec, tokenized in zip(valid, chosen, tokens, strict=True):
                if tokenized.truncated and spec.options.get("truncate") is False:
                    limit = self.token_limit(spec.is_query, spec.options)
                    results[index] = invalid(
                        f"Input is longer than {limit} tokens and truncate is false", codes.INPUT_TOO_LONG
                    )
            runnable = [(i, s, t) for i, s, t in zip(valid, chosen, tokens, strict=True) if results[i].ok]
            if runnable:
                self._encode_runnable(runnable, results, watch)
        return watch.finish(results)

    def _encode_runnable(self, runnable: list, results: list[ItemResult], watch: Stopwatch) -> None:
        """One forward pass per run of similar lengths (`length_groups`): rows do not interact, so each row's
        result is what the whole batch would give, with less padding computed."""
        for group in length_groups([len(tokenized.input_ids) for _, _, tokenized in runnable]):
            indices, specs, tokens = zip(*(runnable[row] for row in group), strict=True)
            batch = self.pad(list(tokens), [(spec.is_query, spec.options) for spec in specs])
            with watch.stage("inference"):
                outputs = self.forward(batch)
            with watch.stage("postprocessing"):
                encoded = self.represent(outputs, self.read_batch(batch, [spec.prefix for spec in specs]), list(specs))
            for index, token_list, result in zip(indices, tokens, encoded, strict=True):
                results[index] = ItemResult(result=result, input_tokens=len(token_list))

    def _encode_spec(self, item: Any) -> EncodeSpec | ItemResult:
        if has_images(item.item):  # never encode the text of an item and leave out its images
            return invalid(IMAGES_NOT_SERVED)
        text = item_text(item.item)
        if text is None:
            return invalid("Item has no text; this model accepts text input only")
        refused = self.refused_options(item.options, OP_ENCODE)
        if refused is not None:
            return refused
        options = self.options_for(item.options)
        output_types = tuple(item.output_types or options.get("output_types") or (self.default_output,))
        supported = self.supported_outputs(options)
        unsupported = sorted(set(output_types) - set(supported))
        if unsupported:
            return invalid(
                f"Model '{self.model.sie_id}' does not support output types: {set(unsupported)}. "
                f"Supported: {set(supported)}"
            )
        output_dtype = options.get("output_dtype") or "float32"
        prepared = self._prepared(item, options)
        preparation = {
            "is_query": item.is_query,
            "instruction": self.shaped_instruction(item.instruction or options.get("instruction")),
            "query_template": options.get("query_template"),
            "doc_template": options.get("doc_template"),
            "default_instruction": options.get("default_instruction"),
        }
        text = prepare_text(text, **preparation)
        marked = self.marked_text(text, item.is_query)
        if marked != text:
            prepared = None  # the sidecar tokenized the text without its marker
        prefix = text_prefix(preparation) if self.skips_prefix else ""
        return EncodeSpec(marked, output_types, output_dtype, options, item.is_query, prepared, prefix)

    def shaped_instruction(self, instruction: str | None) -> str | None:
        """A request's instruction as the model's recipe writes it (as given, unless an adapter says otherwise)."""
        return instruction

    def _prepared(self, item: Any, options: Mapping[str, Any]) -> TokenizedText | None:
        """Sidecar tokens are reused only when they come from this exact tokenizer and text preparation
        (the descriptor carries no default instruction, so a profile with one re-tokenizes here)."""
        tokens = getattr(item, "prepared_tokens", None)
        if tokens is None or tokens.tokenizer_id != self.tokenizer.tokenizer_id or not tokens.input_ids:
            return None
        if len(tokens.input_ids[0]) > self.tokenizer.max_length:  # cut longer here (the model's positions)
            return None
        if self.runtime_options.get("instruction") and not item.instruction:
            return None
        template = options.get("query_template" if item.is_query else "doc_template")
        if template and INSTRUCTION_PLACEHOLDER in template:  # filled from options the descriptor does not carry
            return None
        return self.tokenizer.prepared(tokens.input_ids[0], tokens.token_type_ids[0] if tokens.token_type_ids else None)

    def _tokens(self, specs: Sequence[EncodeSpec]) -> list[TokenizedText]:
        """Each spec's tokens as the model reads them: the sidecar's where it sent them, else tokenized here."""
        missing = [spec.text for spec in specs if spec.prepared is None]
        fresh = iter(self.tokenizer.encode_batch(missing) if missing else [])
        return [
            self.fit(spec.prepared if spec.prepared is not None else next(fresh), spec.is_query, spec.options)
            for spec in specs
        ]

    def supported_outputs(self, options: Mapping[str, Any]) -> tuple[str, ...]:
        """The output types an item with these (merged) options may ask for."""
        return self.encode_outputs

    def token_limit(self, is_query: bool, options: Mapping[str, Any]) -> int:
        """The most tokens one text keeps: the options' `max_seq_length` when below the model's own limit."""
        limit = options.get("max_seq_length")
        return min(int(limit), self.tokenizer.max_length) if limit else self.tokenizer.max_length

    def fit(self, tokenized: TokenizedText, is_query: bool, options: Mapping[str, Any]) -> TokenizedText:
        """The tokens the model reads for one tokenized text (cut to `token_limit`)."""
        return self.tokenizer.cut(tokenized, self.token_limit(is_query, options))

    def pad(self, tokens: Sequence[TokenizedText], roles: Sequence[tuple[bool, Mapping[str, Any]]]) -> PaddedBatch:
        """One padded batch of fitted texts; `roles` gives each text's `(is_query, options)`."""
        return pad_batch([t.input_ids for t in tokens], [t.token_type_ids for t in tokens], self.tokenizer.pad_id)

    @abstractmethod
    def forward(self, batch: PaddedBatch) -> list[np.ndarray]:
        """Run the graph once for the padded batch and return the outputs this adapter reads."""

    @abstractmethod
    def represent(self, outputs: list[np.ndarray], batch: PaddedBatch, specs: list[EncodeSpec]) -> list[dict]:
        """Public encode results (`{"dense": …}` etc.), one per spec, in order."""

    @abstractmethod
    def similarities(self, outputs: list[np.ndarray], batch: PaddedBatch, query: int, docs: range) -> np.ndarray:
        """Scores of rows `docs` against row `query` of the batch."""

    def score(self, items: Sequence[Any]) -> BatchResult:
        """Bi-encoder scoring: the query and every document of every item in one forward pass."""
        watch = Stopwatch()
        results: list[ItemResult] = []
        texts: list[str] = []
        roles: list[tuple[bool, Mapping[str, Any]]] = []
        prefixes: list[str] = []
        spans: list[tuple[int, range] | None] = []
        for item in items:
            refused = self.refused_options(item.options, OP_SCORE)
            span = None if refused else self._score_texts(item, texts, roles, prefixes)
            spans.append(span)
            results.append(refused or (ItemResult() if span else invalid("Score needs a text query and text items")))
        if texts:
            with watch.stage("tokenization"):
                encoded = self.tokenizer.encode_batch(texts)
                tokens = [self.fit(t, is_query, options) for t, (is_query, options) in zip(encoded, roles, strict=True)]
            batch = self.pad(tokens, roles)
            with watch.stage("inference"):
                outputs = self.forward(batch)
            with watch.stage("postprocessing"):
                read = self.read_batch(batch, prefixes)
                for index, (item, span) in enumerate(zip(items, spans, strict=True)):
                    if span is not None:
                        scores = self.similarities(outputs, read, span[0], span[1])
                        n_tokens = sum(len(tokens[i]) for i in (span[0], *span[1]))
                        results[index] = ItemResult(ranked_scores(scores, item.score_items), input_tokens=n_tokens)
        return watch.finish(results)

    def _score_texts(
        self, item: Any, texts: list[str], roles: list[tuple[bool, Mapping[str, Any]]], prefixes: list[str]
    ) -> tuple[int, range] | None:
        query = item_text(item.query_item)
        docs = [item_text(doc) for doc in item.score_items]
        if query is None or not docs or any(doc is None for doc in docs):
            return None
        options = self.options_for(item.options)
        instruction = self.shaped_instruction(item.instruction or options.get("instruction"))
        query_index = len(texts)
        preparation = {"instruction": instruction, "query_template": options.get("query_template"),
                       "default_instruction": options.get("default_instruction")}  # fmt: skip
        texts.append(self.marked_text(prepare_text(query, is_query=True, **preparation), True))
        doc_template = options.get("doc_template")
        texts.extend(self.marked_text(prepare_text(doc, doc_template=doc_template), False) for doc in docs)
        roles.extend([(True, options)] + [(False, options)] * len(docs))
        if self.skips_prefix:  # else `prefixes` stays empty: `read_batch` reads none
            prefixes.append(text_prefix({"is_query": True, **preparation}))
            prefixes.extend([text_prefix({"doc_template": doc_template})] * len(docs))
        return query_index, range(query_index + 1, len(texts))

    def read_batch(self, batch: PaddedBatch, prefixes: Sequence[str]) -> PaddedBatch:
        """The batch `represent` and `similarities` read: `batch`, or (`skips_prefix`) with each row's first n
        positions masked out, n the number of tokens its prefix makes alone, as NV-Embed's remote code counts them
        (`len(tokenizer.tokenize(instruction))`; with the leading special token, the prefix's last token stays)."""
        if not self.skips_prefix or not any(prefixes):
            return batch
        # a batch's rows share a few prefixes (one per instruction): each is tokenized once
        lengths = {prefix: len(self.tokenizer.tokens(prefix, add_special_tokens=False)) for prefix in set(prefixes)}
        mask = batch.attention_mask.copy()
        for row, prefix in enumerate(prefixes):
            mask[row, : lengths[prefix]] = 0
        return attrs.evolve(batch, attention_mask=mask)

    def marked_text(self, text: str, is_query: bool) -> str:
        """The text as tokenized, for adapters that mark queries or documents with a text prefix."""
        return text


def text_prefix(preparation: Mapping[str, Any]) -> str:
    """What `prepare_text` with these keyword arguments puts before the text: the instruction, the template's
    start."""
    marker = "\x00"
    return prepare_text(marker, **preparation).partition(marker)[0]


def output_width(session: Any, name: str) -> int | None:
    """The last dimension of output `name` when the graph fixes it, else None."""
    width = next(node.shape[-1] for node in session.get_outputs() if node.name == name)
    return width if isinstance(width, int) else None


def check_width(model: Any, kind: str, width: int | None, what: str) -> None:
    """A ValueError (a load failure) when the YAML declares a `kind` dim the model does not produce: a vector of
    another width would be a silently wrong answer."""
    declared = model.dims.get(kind)
    if declared is not None and width is not None and width != declared:
        raise ValueError(
            f"{what} {width}-dimensional {kind} vectors, but the model's YAML declares dim {declared} "
            f"(tasks.encode.{kind}.dim)"
        )


def first_output(session: Any, rank: int, preferred: Sequence[str] = ()) -> str:
    """The graph output to read: a preferred name if present, else the first float output of `rank` dims."""
    outputs = session.get_outputs()
    names = {node.name for node in outputs}
    for name in preferred:
        if name in names:
            return name
    for node in outputs:
        if node.type == "tensor(float)" and len(node.shape) == rank:
            return node.name
    raise ValueError(f"the ONNX graph has no float output of rank {rank}: {sorted(names)}")
