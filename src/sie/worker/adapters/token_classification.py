"""Entity extraction with a token-classification head: softmax per token, BIO/IOB2 span decoding with
character offsets from the tokenizer, optional filtering by the request's labels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs
import numpy as np

from sie.catalog.adapters import TOKEN_CLASSIFICATION
from sie.tokenization import TokenizedText, pad_batch
from sie.wire.ipc_batch import OP_EXTRACT
from sie.worker.adapters.base import Adapter, AdapterContext, BatchResult, ItemResult, Stopwatch, entity_result, invalid
from sie.worker.adapters.encoder import first_output, item_text
from sie.worker.adapters.feeds import bert_feeds

DEFAULT_THRESHOLD = 0.5


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def label_key(label: str) -> str:
    """Labels compare case-insensitively, with spaces and hyphens as underscores."""
    return label.strip().lower().replace(" ", "_").replace("-", "_")


@attrs.define
class _Span:
    label: str
    start: int
    end: int
    scores: list[float]


def _split_tag(tag: str) -> tuple[str, str]:
    if len(tag) > 2 and tag[1] == "-" and tag[0] in "BIES":
        return tag[0], tag[2:]
    return "B", tag


def decode_spans(
    tokens: TokenizedText, probabilities: np.ndarray, id2label: Mapping[int, str], threshold: float
) -> list[_Span]:
    """Merge token tags into spans: `I-X` continues an `X` span, as does a `B-X` piece touching the previous one."""
    spans: list[_Span] = []
    current: _Span | None = None
    for position, (start, end) in enumerate(tokens.offsets):
        if tokens.special_tokens_mask[position] or start == end:
            continue
        label_id = int(probabilities[position].argmax())
        tag, score = id2label.get(label_id, "O"), float(probabilities[position, label_id])
        if tag == "O" or score < threshold:
            current = None
            continue
        prefix, label = _split_tag(tag)
        continues = current is not None and current.label == label and (prefix == "I" or start == current.end)
        if continues:
            current.end = end
            current.scores.append(score)
        else:
            current = _Span(label, start, end, [score])
            spans.append(current)
    return spans


def _id2label(config: Mapping[str, Any]) -> dict[int, str]:
    raw = config.get("id2label") or {}
    return {int(key): str(value) for key, value in raw.items()}


class TokenClassificationAdapter(Adapter):
    """`sie.adapters.token_classification`: extract only; labels come from config.json `id2label`."""

    kind: ClassVar[str | None] = TOKEN_CLASSIFICATION
    supports_extract: ClassVar[bool] = True

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        self._logits = first_output(self.session, rank=3, preferred=("logits",))
        self._id2label = _id2label(context.model_config_json)
        if not self._id2label:
            raise ValueError(f"model '{self.model.sie_id}' has no id2label in config.json")

    def extract(self, items: Sequence[Any]) -> BatchResult:
        watch = Stopwatch()
        texts = [item_text(item.item) for item in items]
        results = [
            self.refused_options(item.options, OP_EXTRACT)
            or (ItemResult() if text is not None else invalid("Item has no text"))
            for item, text in zip(items, texts, strict=True)
        ]
        valid = [index for index, text in enumerate(texts) if text is not None and results[index].ok]
        if valid:
            with watch.stage("tokenization"):
                tokens = self.tokenizer.encode_batch([texts[index] for index in valid])
                batch = pad_batch(
                    [t.input_ids for t in tokens], [t.token_type_ids for t in tokens], self.tokenizer.pad_id
                )
            with watch.stage("inference"):
                (logits,) = self.run_session(bert_feeds(batch), [self._logits])
            with watch.stage("postprocessing"):
                probabilities = softmax(logits.astype(np.float32))
                for row, index in enumerate(valid):
                    entities = self._entities(items[index], texts[index], tokens[row], probabilities[row])
                    results[index] = ItemResult(entity_result(entities), input_tokens=len(tokens[row]))
        return watch.finish(results)

    def _entities(self, item: Any, text: str, tokens: TokenizedText, probabilities: np.ndarray) -> list[dict]:
        options = self.options_for(item.options)
        threshold = float(options.get("threshold", DEFAULT_THRESHOLD))
        wanted = {label_key(label) for label in item.labels or ()}
        return [
            {
                "text": text[span.start : span.end],
                "label": span.label,
                "score": float(np.mean(span.scores)),
                "start": span.start,
                "end": span.end,
                "bbox": None,
            }
            for span in decode_spans(tokens, probabilities, self._id2label, threshold)
            if not wanted or label_key(span.label) in wanted
        ]
