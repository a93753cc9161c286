"""Cross-encoder reranking: each (query, document) pair through a sequence-classification head."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from sie.catalog.adapters import CROSS_ENCODER
from sie.tokenization import pad_batch, prepare_text
from sie.wire.ipc_batch import OP_SCORE
from sie.worker.adapters.base import Adapter, AdapterContext, BatchResult, ItemResult, Stopwatch, invalid
from sie.worker.adapters.encoder import first_output, item_text, ranked_scores
from sie.worker.adapters.feeds import bert_feeds


def relevance(logits: np.ndarray) -> np.ndarray:
    """One relevance per pair: sigmoid of a single logit, else the softmax probability of the last label."""
    if logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logits[:, 0]))
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted[:, -1] / shifted.sum(axis=1)


class CrossEncoderAdapter(Adapter):
    """`sie.adapters.cross_encoder`: score only."""

    kind: ClassVar[str | None] = CROSS_ENCODER
    supports_score: ClassVar[bool] = True

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        self._logits = first_output(self.session, rank=2, preferred=("logits",))

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
                tokens = self.tokenizer.encode_batch(pairs)
                batch = pad_batch(
                    [t.input_ids for t in tokens], [t.token_type_ids for t in tokens], self.tokenizer.pad_id
                )
            with watch.stage("inference"):
                (logits,) = self.run_session(bert_feeds(batch), [self._logits])
            with watch.stage("postprocessing"):
                scores = relevance(logits.astype(np.float32))
                for index, (item, span) in enumerate(zip(items, spans, strict=True)):
                    if span is not None:
                        n_tokens = sum(len(tokens[i]) for i in span)
                        results[index] = ItemResult(
                            ranked_scores(scores[span], item.score_items), input_tokens=n_tokens
                        )
        return watch.finish(results)
