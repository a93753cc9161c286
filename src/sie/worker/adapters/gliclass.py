"""Zero-shot classification with a GLiClass uni-encoder: each text is read with the request's labels, as the gliclass
pipeline writes them (`text<<LABEL>>a<<LABEL>>b<<SEP>>`, or the labels first for `prompt_first` models; an
instruction is the pipeline's task prompt after `<<SEP>>`), the converted graph (`sie.worker.convert.gliclass`) gives
one logit per label, and the scores are the pipeline's: a softmax across the labels (`single-label`) or a sigmoid
each (`multi-label`; also a single label, whose softmax would be 1 for any text). Labels at or above `threshold`
come back, best first. A text too long for the model is cut so that every label is still read.

`examples` (`[{"text": ..., "labels": [...]}]`) are few-shot examples, written after the text as the pipeline writes
them. `label_groups` (`{"urgency": ["low", "high"], "topic": [...]}`) classify one text along several label sets at
once: each group is a row of its own, scored like a request of its labels; `classifications` read `group.label` and
`data` holds each group's best label (single-label) or its labels at or above the threshold (multi-label).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs
import numpy as np

from sie.catalog.adapters import GLICLASS
from sie.tokenization import TokenizedText, pad_batch
from sie.worker.adapters.base import Adapter, AdapterContext, BatchResult, ItemResult, Stopwatch, invalid
from sie.worker.adapters.encoder import item_text
from sie.worker.adapters.zero_shot import zero_shot_refusal
from sie.worker.convert.names import LABEL_WEIGHTS, LOGITS

LABEL_TOKEN = "<<LABEL>>"
SEP_TOKEN = "<<SEP>>"
EXAMPLE_TOKEN = "<<EXAMPLE>>"
SINGLE, MULTI = "single-label", "multi-label"
CLASSIFICATION_TYPES = {"single": SINGLE, "single-label": SINGLE, "single_label": SINGLE, "multi": MULTI,
                        "multi-label": MULTI, "multi_label": MULTI}  # fmt: skip


@attrs.frozen
class _Context:
    """What a request reads beside its text and labels: the task prompt and its few-shot examples, written out."""

    prompt: str
    examples: str


def examples_text(examples: Sequence[Mapping[str, Any]] | None) -> str:
    """Few-shot examples as gliclass writes them after the text: `<<EXAMPLE>>text \nLabels:\n a, b` each, then one
    `<<SEP>>`; "" for none."""
    if not examples:
        return ""
    written = "".join(f"{EXAMPLE_TOKEN}{example['text']} \nLabels:\n {', '.join(example['labels'])}"
                      for example in examples)  # fmt: skip
    return written + SEP_TOKEN


@attrs.frozen
class _Plan:
    """One row of one item before it is encoded: its text, labels (one group's, or the request's) and context."""

    item: int
    group: str | None
    labels: list[str]
    text: str
    context: _Context


@attrs.frozen
class _Row:
    """One text with one label set, encoded."""

    item: int
    group: str | None
    labels: list[str]
    tokens: TokenizedText
    weights: np.ndarray  # [labels, tokens]


class GliclassAdapter(Adapter):
    """`sie.adapters.gliclass`: extract only; `classifications` for the labels (or label groups) of each request."""

    kind: ClassVar[str | None] = GLICLASS
    supports_extract: ClassVar[bool] = True

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        config = context.model_config_json
        self._prompt_first = bool(config.get("prompt_first", False))
        self._embed_marker = bool(config.get("embed_class_token", True))
        self._average = config.get("class_token_pooling", "first") == "average"
        self._marker = int(config["class_token_index"]) if "class_token_index" in config else None
        if self._marker is None or self.tokenizer.token_to_id(LABEL_TOKEN) != self._marker:
            raise ValueError(f"the tokenizer's {LABEL_TOKEN} is not config.json's class_token_index")
        loadtime = context.profile.loadtime_options
        self._default_type = CLASSIFICATION_TYPES.get(str(loadtime.get("classification_type", MULTI)), MULTI)

    def extract(self, items: Sequence[Any]) -> BatchResult:
        watch = Stopwatch()
        results = [self._refusal(item) or ItemResult() for item in items]
        with watch.stage("tokenization"):
            plans = [plan for index, item in enumerate(items) if results[index].ok for plan in self._plans(index, item)]
            rows = self._rows(plans, results)
        if rows:
            with watch.stage("inference"):
                logits = self._logits(rows)
            with watch.stage("postprocessing"):
                by_item: dict[int, list[tuple[_Row, np.ndarray]]] = {}
                for row, row_logits in zip(rows, logits, strict=True):
                    by_item.setdefault(row.item, []).append((row, row_logits))
                for index, mine in by_item.items():
                    results[index] = self._answer(items[index], mine)
        return watch.finish(results)

    def _refusal(self, item: Any) -> ItemResult | None:
        refused = zero_shot_refusal(self, item)
        if refused is None and item.labels and (item.options or {}).get("label_groups") is not None:
            return invalid("Send either labels or options.label_groups, not both")
        return refused

    def _plans(self, index: int, item: Any) -> list[_Plan]:
        """The item's rows to encode: one per label group, or one for its labels."""
        options = self.options_for(item.options)
        groups: Mapping[str, list[str]] = options.get("label_groups") or {}
        label_sets = list(groups.items()) if groups else [(None, list(item.labels))]
        prompt = item.instruction or options.get("instruction") or ""
        context = _Context(prompt, examples_text(options.get("examples")))
        text = item_text(item.item) or ""
        return [_Plan(index, group, labels, text, context) for group, labels in label_sets]

    def _rows(self, plans: list[_Plan], results: list[ItemResult]) -> list[_Row]:
        """Every plan encoded in one tokenizer call; a row too long for the model is encoded again with its text cut,
        and an item whose labels leave no room for its text gets that error instead of rows."""
        encoded = self.tokenizer.encode_batch([self._sequence(p.text, p.labels, p.context) for p in plans])
        rows: list[_Row] = []
        for plan, tokens in zip(plans, encoded, strict=True):
            fitted = self._fit(plan) if tokens.truncated else tokens
            if fitted is None:
                results[plan.item] = invalid(
                    f"The {len(plan.labels)} labels take all of the model's {self.tokenizer.max_length} tokens and "
                    "leave none for the text: send fewer or shorter labels"
                )
            elif results[plan.item].ok:
                weights = self._label_weights(fitted.input_ids, len(plan.labels))
                rows.append(_Row(plan.item, plan.group, plan.labels, fitted, weights))
        return [row for row in rows if results[row.item].ok]

    def _sequence(self, text: str, labels: list[str], context: _Context) -> str:
        """The row as the gliclass pipeline writes it: labels, `<<SEP>>` and the task prompt before or after the text,
        the few-shot examples last."""
        marked = "".join(f"{LABEL_TOKEN}{label}" for label in labels) + SEP_TOKEN + context.prompt
        return (marked + text if self._prompt_first else text + marked) + context.examples

    def _fit(self, plan: _Plan) -> TokenizedText | None:
        """A row too long for the model with its text cut (by tokens) so that it fits beside every label; None when
        the labels (and examples) alone fill the model."""
        labels, context = plan.labels, plan.context
        room = self.tokenizer.max_length - self.tokenizer.count_tokens(self._sequence("", labels, context))
        if room < 1:
            return None
        pieces = self.tokenizer.tokens(plan.text, add_special_tokens=False)
        sequence = self._sequence(plan.text, labels, context)
        for keep in range(min(room, len(pieces)), 0, -1):  # a cut may join pieces: one fewer until it fits
            sequence = self._sequence(plan.text[: pieces[keep - 1]["stop"]], labels, context)
            if self.tokenizer.count_tokens(sequence) <= self.tokenizer.max_length:
                break
        (tokens,) = self.tokenizer.encode_batch([sequence])
        return tokens

    def _markers(self, ids: np.ndarray) -> int:
        return int(np.count_nonzero(ids == self._marker))

    def _label_weights(self, ids: np.ndarray, labels: int) -> np.ndarray:
        """Each label's tokens as gliclass pools them: its marker (or the token after it), or with `average` every
        token from its marker to the next one (past the last marker: to the end), the marker left out unless
        embedded."""
        weights = np.zeros((labels, len(ids)), dtype=np.float32)
        positions = np.flatnonzero(ids == self._marker)[:labels]
        shift = 0 if self._embed_marker else 1
        for label, position in enumerate(positions.tolist()):
            if not self._average:
                weights[label, min(position + shift, len(ids) - 1)] = 1.0
                continue
            stop = positions[label + 1] if label + 1 < len(positions) else len(ids)
            weights[label, position + shift : stop] = 1.0
            weights[label] /= max(1.0, weights[label].sum())
        return weights

    def _logits(self, rows: list[_Row]) -> np.ndarray:
        batch = pad_batch([row.tokens.input_ids for row in rows], None, self.tokenizer.pad_id)
        width = max(len(row.labels) for row in rows)
        weights = np.zeros((len(rows), width, batch.input_ids.shape[1]), dtype=np.float32)
        for number, row in enumerate(rows):
            weights[number, : row.weights.shape[0], : row.weights.shape[1]] = row.weights
        feeds = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                 "token_type_ids": batch.token_type_ids, LABEL_WEIGHTS: weights}  # fmt: skip
        (logits,) = self.run_session(feeds, [LOGITS])
        return logits.astype(np.float32, copy=False)

    def _answer(self, item: Any, rows: list[tuple[_Row, np.ndarray]]) -> ItemResult:
        options = self.options_for(item.options)
        kind = CLASSIFICATION_TYPES.get(str(options.get("classification_type") or self._default_type), MULTI)
        threshold = float(options.get("threshold") or 0.0)
        classifications: list[dict[str, Any]] = []
        data: dict[str, Any] = {}
        for row, logits in rows:
            scores = _scores(logits[: len(row.labels)], kind)
            named = [(f"{row.group}.{label}" if row.group else label, float(score))
                     for label, score in zip(row.labels, scores.tolist(), strict=True)]  # fmt: skip
            kept = [{"label": label, "score": score} for label, score in named if score >= threshold]
            classifications += kept
            if row.group is not None:
                best = row.labels[int(np.argmax(scores))]
                above = [label for label, score in zip(row.labels, scores.tolist(), strict=True) if score >= threshold]
                data[row.group] = best if kind == SINGLE else above
        classifications.sort(key=lambda one: -one["score"])
        result = {"entities": [], "relations": [], "classifications": classifications, "objects": [], "data": data}
        return ItemResult(result, input_tokens=sum(len(row.tokens) for row, _ in rows))


def _scores(logits: np.ndarray, kind: str) -> np.ndarray:
    if kind == SINGLE and len(logits) > 1:
        shifted = np.exp(logits - logits.max())
        return shifted / shifted.sum()
    return 0.5 * (1.0 + np.tanh(0.5 * logits))  # the sigmoid, without exp's overflow on large logits
