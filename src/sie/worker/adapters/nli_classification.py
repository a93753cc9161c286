"""Zero-shot classification with an NLI model (an entailment head: MNLI's three labels, or the binary
entailment / not_entailment of the zeroshot-v2.0 models): each label of a request becomes a hypothesis through the
template ("This text is about {}."), each (text, hypothesis) pair runs through the sequence-classification graph, and
the scores are those of transformers' zero-shot-classification pipeline: a softmax of the entailment logits across
the labels, or with `multi_label` (and always for a single label) each label's entailment against contradiction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from sie.catalog.adapters import NLI_CLASSIFICATION
from sie.tokenization import pad_batch
from sie.worker.adapters.base import Adapter, AdapterContext, BatchResult, ItemResult, Stopwatch
from sie.worker.adapters.encoder import first_output, item_text
from sie.worker.adapters.feeds import bert_feeds
from sie.worker.adapters.zero_shot import zero_shot_refusal

DEFAULT_TEMPLATE = "This text is about {}."


def entailment_index(config_json: Mapping[str, Any]) -> int:
    """The position of the entailment label in config.json's `id2label` (the first named `entail…`, as the
    pipeline finds it); ValueError when there is none."""
    id2label = config_json.get("id2label") or {}
    for key, label in sorted(id2label.items(), key=lambda pair: int(pair[0])):
        if str(label).lower().startswith("entail"):
            return int(key)
    raise ValueError(f"config.json's id2label {dict(id2label)} names no entailment label: not an NLI model")


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


class NliClassificationAdapter(Adapter):
    """`sie.adapters.nli_classification`: extract only; `classifications` for the labels each request names."""

    kind: ClassVar[str | None] = NLI_CLASSIFICATION
    supports_extract: ClassVar[bool] = True

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        self._logits = first_output(self.session, rank=2, preferred=("logits",))
        self._entailment = entailment_index(context.model_config_json)
        labels = len(context.model_config_json.get("id2label") or {})
        self._contradiction = labels - 1 if self._entailment == 0 else 0

    def extract(self, items: Sequence[Any]) -> BatchResult:
        watch = Stopwatch()
        results = [zero_shot_refusal(self, item) or ItemResult() for item in items]
        pairs: list[tuple[str, str]] = []
        spans: dict[int, range] = {}
        for index, item in enumerate(items):
            if results[index].ok:
                template = self.options_for(item.options).get("hypothesis_template") or DEFAULT_TEMPLATE
                text = item_text(item.item) or ""
                start = len(pairs)
                pairs += [(text, template.format(label)) for label in item.labels]
                spans[index] = range(start, len(pairs))
        if pairs:
            with watch.stage("tokenization"):
                tokens = self.tokenizer.encode_batch(pairs)
                batch = pad_batch([t.input_ids for t in tokens], [t.token_type_ids for t in tokens],
                                  self.tokenizer.pad_id)  # fmt: skip
            with watch.stage("inference"):
                (logits,) = self.run_session(bert_feeds(batch), [self._logits])
            with watch.stage("postprocessing"):
                logits = logits.astype(np.float32)
                for index, span in spans.items():
                    item = items[index]
                    scores = self._scores(logits[span], bool(self.options_for(item.options).get("multi_label")))
                    ranked = sorted(zip(item.labels, scores.tolist(), strict=True), key=lambda pair: -pair[1])
                    classifications = [{"label": label, "score": score} for label, score in ranked]
                    results[index] = ItemResult(
                        {"entities": [], "relations": [], "classifications": classifications, "objects": [],
                         "data": {}},
                        input_tokens=sum(len(tokens[row]) for row in span),
                    )  # fmt: skip
        return watch.finish(results)

    def _scores(self, logits: np.ndarray, multi_label: bool) -> np.ndarray:
        """One score per label from its pair's logits [labels, classes]."""
        if multi_label or len(logits) == 1:
            return _softmax(logits[:, [self._contradiction, self._entailment]])[:, 1]
        return _softmax(logits[:, self._entailment])
