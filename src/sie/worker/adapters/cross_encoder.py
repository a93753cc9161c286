"""Cross-encoder reranking: each (query, document) pair through a sequence-classification head, then the
activation the model was saved with (as sentence-transformers' `CrossEncoder.predict` applies it): the score of a
pair is the activated value of its last label."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from sie.catalog.adapters import CROSS_ENCODER
from sie.tokenization import PaddedBatch, pad_batch, prepare_text
from sie.wire.ipc_batch import OP_SCORE
from sie.worker.adapters.base import Adapter, AdapterContext, BatchResult, ItemResult, Stopwatch, invalid
from sie.worker.adapters.encoder import first_output, item_text, ranked_scores
from sie.worker.adapters.feeds import bert_feeds


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


# The torch activations a saved cross-encoder names (`activation_fn`), by class name, over [pairs, labels] logits.
ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Sigmoid": lambda logits: 0.5 * (1.0 + np.tanh(0.5 * logits)),  # no exp overflow on large logits
    "Identity": lambda logits: logits,
    "Tanh": np.tanh,
    "Softmax": _softmax,
}
SETTINGS_FILE = "config_sentence_transformers.json"


def saved_activation(config_json: Mapping[str, Any], model_dir: Path | None) -> str | None:
    """The activation's torch path as sentence-transformers saved it: `activation_fn` in its settings file (6.x),
    else in config.json's `sentence_transformers` (4.x-5.x), else `sbert_ce_default_activation_function` (older)."""
    settings_path = model_dir / SETTINGS_FILE if model_dir is not None else None
    if settings_path is not None and settings_path.is_file():
        try:
            settings = json.loads(settings_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{settings_path}: cannot read it: {exc}") from exc
        if isinstance(settings, dict) and settings.get("activation_fn"):
            return str(settings["activation_fn"])
    nested = config_json.get("sentence_transformers")
    if isinstance(nested, dict) and nested.get("activation_fn"):
        return str(nested["activation_fn"])
    older = config_json.get("sbert_ce_default_activation_function")
    return str(older) if older else None


def activation_named(path: str | None) -> Callable[[np.ndarray], np.ndarray] | None:
    """The activation for a saved torch path; None when none was saved (the default applies); ValueError naming
    one SIE does not apply."""
    if path is None:
        return None
    name = path.rsplit(".", 1)[-1]
    if name not in ACTIVATIONS:
        raise ValueError(f"the cross-encoder's activation {path!r} is not one SIE applies ({sorted(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def relevance(logits: np.ndarray, activation: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """One relevance per pair: the last label's value after `activation`; without one, as sentence-transformers
    defaults for one label (sigmoid), and the softmax probability of the last label for more."""
    if activation is None:
        activation = ACTIVATIONS["Sigmoid"] if logits.shape[1] == 1 else _softmax
    return activation(logits)[:, -1]


class CrossEncoderAdapter(Adapter):
    """`sie.adapters.cross_encoder`: score only."""

    kind: ClassVar[str | None] = CROSS_ENCODER
    supports_score: ClassVar[bool] = True

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        self._logits = first_output(self.session, rank=2, preferred=("logits",))
        self._activation = activation_named(saved_activation(context.model_config_json, context.model_dir))

    def pair_batch(self, pairs: Sequence[tuple[str, str]]) -> tuple[list[Any], PaddedBatch]:
        """The (query, document) pairs tokenized together, and padded into one batch."""
        tokens = self.tokenizer.encode_batch(list(pairs))
        batch = pad_batch([t.input_ids for t in tokens], [t.token_type_ids for t in tokens], self.tokenizer.pad_id)
        return tokens, batch

    def score(self, items: Sequence[Any]) -> BatchResult:
        watch = Stopwatch()
        pairs: list[tuple[str, str]] = []
        spans: list[range | None] = []
        refusals = [self.refused_options(item.options, OP_SCORE) for item in items]
        for item, refused in zip(items, refusals, strict=True):
            query, docs = item_text(item.query_item), [item_text(doc) for doc in item.score_items]
            if refused or query is None or not docs or any(doc is None for doc in docs):
                spans.append(None)
                continue
            options = self.options_for(item.options)
            query = prepare_text(query, is_query=True, instruction=item.instruction or options.get("instruction"))
            start = len(pairs)
            pairs.extend((query, doc) for doc in docs)
            spans.append(range(start, len(pairs)))
        results = [
            refused or (ItemResult() if span else invalid("Score needs a text query and text items"))
            for span, refused in zip(spans, refusals, strict=True)
        ]
        if pairs:
            with watch.stage("tokenization"):
                tokens, batch = self.pair_batch(pairs)
            with watch.stage("inference"):
                (logits,) = self.run_session(bert_feeds(batch), [self._logits])
            with watch.stage("postprocessing"):
                scores = relevance(logits.astype(np.float32), self._activation)
                for index, (item, span) in enumerate(zip(items, spans, strict=True)):
                    if span is not None:
                        n_tokens = sum(len(tokens[i]) for i in span)
                        results[index] = ItemResult(
                            ranked_scores(scores[span], item.score_items), input_tokens=n_tokens
                        )
        return watch.finish(results)
