"""Zero-shot entity extraction with a GLiNER span model: each text is split into words, prefixed with the request's
labels as GLiNER's prompt (`<<ENT>> label … <<SEP>>`) and encoded word by word; the converted graph
(`sie.worker.convert.gliner`) scores every span of up to `max_width` words against every label, and spans are picked
and their overlaps resolved as the `gliner` package does (`sie.worker.spans`). A text longer than the model reads at
once (`max_len` words, or the tokens the labels leave) is read in overlapping windows, each span taken from the
window that holds it away from an edge, so offsets stay those of the whole text. Rows of one batch may carry
different label sets: each row's label markers are found where its own prompt put them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs
import numpy as np

from sie.catalog.adapters import GLINER
from sie.catalog.options import labels_problem
from sie.tokenization import TokenizedWords, pad_batch
from sie.wire import codes
from sie.wire.ipc_batch import OP_EXTRACT
from sie.worker.adapters.base import Adapter, AdapterContext, BatchResult, ItemResult, Stopwatch, invalid
from sie.worker.adapters.encoder import item_text
from sie.worker.convert.names import (
    GLINER_CONFIG_FILE,
    LABEL_POSITIONS,
    SPAN_SCORES,
    WORD_COUNTS,
    WORD_POSITIONS,
)
from sie.worker.spans import (
    Span,
    Window,
    Word,
    candidate_spans,
    merge_adjacent,
    plan_windows,
    resolve_overlaps,
    split_words,
)

DEFAULT_THRESHOLD = 0.5
# Most windows one text is read in (about 40,000 words at 384 a window): a longer text is refused, not read in part.
MAX_WINDOWS = 128
# Labels a worker accepts on an item that did not pass a gateway (the gateway's own limit is SIE_GATEWAY_MAX_LABELS).
MAX_LABELS = 1000


@attrs.frozen
class PromptSettings:
    """What the adapter reads of `gliner_config.json`."""

    max_len: int = 384
    ent_token: str = "<<ENT>>"
    sep_token: str = "<<SEP>>"
    embed_ent_token: bool = True

    @classmethod
    def read(cls, context: AdapterContext) -> PromptSettings:
        path = context.model_dir / GLINER_CONFIG_FILE if context.model_dir is not None else None
        if path is None or not path.is_file():
            raise ValueError(f"no {GLINER_CONFIG_FILE} beside the model")
        raw = json.loads(path.read_text(encoding="utf-8"))
        return cls(int(raw.get("max_len", 384)), str(raw.get("ent_token", "<<ENT>>")),
                   str(raw.get("sep_token", "<<SEP>>")), bool(raw.get("embed_ent_token", True)))  # fmt: skip


@attrs.frozen
class _Row:
    """One window of one item's text, encoded with its prompt."""

    item: int
    window: Window
    tokens: TokenizedWords
    word_positions: list[int]
    label_positions: list[int]


@attrs.frozen
class _Request:
    """One valid item: its text, words, distinct labels and options."""

    text: str
    words: list[Word]
    labels: list[str]
    threshold: float
    flat: bool
    multi_label: bool
    max_width: int
    merge: bool


class GlinerAdapter(Adapter):
    """`sie.adapters.gliner`: extract only; the labels come with each request."""

    kind: ClassVar[str | None] = GLINER
    supports_extract: ClassVar[bool] = True

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        self.settings = PromptSettings.read(context)
        (output,) = [node for node in self.session.get_outputs() if node.name == SPAN_SCORES]
        self.max_width = int(output.shape[2])
        # Windows share enough words that a span owned by one never reaches its edge.
        self.overlap = max(2 * self.max_width, 32)

    def extract(self, items: Sequence[Any]) -> BatchResult:
        watch = Stopwatch()
        results: list[ItemResult] = [ItemResult() for _ in items]
        requests: dict[int, _Request] = {}
        for index, item in enumerate(items):
            prepared = self._request(item)
            if isinstance(prepared, ItemResult):
                results[index] = prepared
            else:
                requests[index] = prepared
        if requests:
            with watch.stage("tokenization"):
                rows = self._rows(requests, results)
            if rows:
                with watch.stage("inference"):
                    scores = self._scores(rows)
                with watch.stage("postprocessing"):
                    self._answer(requests, rows, scores, results)
        return watch.finish(results)

    def _request(self, item: Any) -> _Request | ItemResult:
        refused = self.refused_options(item.options, OP_EXTRACT)
        if refused is not None:
            return refused
        text = item_text(item.item)
        if text is None or not text.strip():
            return invalid("GLiNER extracts from a non-blank text")
        problem = labels_problem(item.labels, GLINER, MAX_LABELS)
        if problem is not None:
            return invalid(problem)
        options = self.options_for(item.options)
        max_width = options.get("max_width") or self.max_width
        return _Request(
            text=text,
            words=split_words(text),
            labels=list(dict.fromkeys(item.labels)),  # gliner reads a repeated label once
            threshold=float(options.get("threshold", DEFAULT_THRESHOLD)),
            flat=bool(options.get("flat_ner", True)),
            multi_label=bool(options.get("multi_label", False)),
            max_width=min(int(max_width), self.max_width),
            merge=bool(options.get("merge_adjacent_entities", False)),
        )

    def _prompt(self, labels: list[str]) -> list[str]:
        words = []
        for label in labels:
            words += [self.settings.ent_token, label]
        return [*words, self.settings.sep_token]

    def _rows(self, requests: dict[int, _Request], results: list[ItemResult]) -> list[_Row]:
        """Every item's windows, encoded with its prompt; an item whose labels leave no room for its text, or whose
        text needs more than MAX_WINDOWS windows, gets its error instead."""
        planned: list[tuple[int, Window, list[str]]] = []
        for index, request in requests.items():
            prompt = self._prompt(request.labels)
            (prompt_tokens,) = self.tokenizer.encode_words([prompt])
            room = self.tokenizer.max_length - len(prompt_tokens)
            if room < 1 or prompt_tokens.truncated:
                results[index] = invalid(
                    f"The {len(request.labels)} labels take {len(prompt_tokens)} of the model's "
                    f"{self.tokenizer.max_length} tokens and leave none for the text: send fewer or shorter labels"
                )
                continue
            counts = self.tokenizer.word_token_counts([word.text for word in request.words])
            windows = plan_windows(counts, self.settings.max_len, room, self.overlap)
            if len(windows) > MAX_WINDOWS:
                results[index] = invalid(
                    f"The text has {len(request.words)} words: more than {MAX_WINDOWS} windows of this model's "
                    f"{self.settings.max_len} words; split it into shorter items", codes.INPUT_TOO_LONG
                )  # fmt: skip
                continue
            planned += [(index, window, prompt) for window in windows]
        encoded = self.tokenizer.encode_words(
            [prompt + [word.text for word in requests[index].words[window.start : window.stop]]
             for index, window, prompt in planned]
        )  # fmt: skip
        rows = []
        for (index, window, prompt), tokens in zip(planned, encoded, strict=True):
            first = tokens.first_tokens()
            shift = 0 if self.settings.embed_ent_token else 1
            labels = [first[marker] + shift for marker in range(0, len(prompt) - 1, 2)]
            words = [first.get(len(prompt) + offset, 0) for offset in range(window.stop - window.start)]
            rows.append(_Row(index, window, tokens, words, labels))
        return rows

    def _scores(self, rows: list[_Row]) -> np.ndarray:
        batch = pad_batch([row.tokens.input_ids for row in rows], None, self.tokenizer.pad_id)
        words = max(len(row.word_positions) for row in rows)
        labels = max(len(row.label_positions) for row in rows)
        word_positions = np.zeros((len(rows), words), dtype=np.int64)
        label_positions = np.zeros((len(rows), labels), dtype=np.int64)
        for number, row in enumerate(rows):
            word_positions[number, : len(row.word_positions)] = row.word_positions
            label_positions[number, : len(row.label_positions)] = row.label_positions
        feeds = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "token_type_ids": batch.token_type_ids,
            WORD_POSITIONS: word_positions,
            WORD_COUNTS: np.array([len(row.word_positions) for row in rows], dtype=np.int64),
            LABEL_POSITIONS: label_positions,
        }
        (scores,) = self.run_session(feeds, [SPAN_SCORES])
        return scores.astype(np.float32, copy=False)

    def _answer(
        self, requests: dict[int, _Request], rows: list[_Row], scores: np.ndarray, results: list[ItemResult]
    ) -> None:
        found: dict[int, list[Span]] = {}
        tokens: dict[int, int] = {}
        for number, row in enumerate(rows):
            request = requests[row.item]
            window = row.window
            spans = candidate_spans(scores[number], window.stop - window.start, len(request.labels),
                                    request.threshold, request.max_width, request.multi_label)  # fmt: skip
            found.setdefault(row.item, []).extend(
                Span(span.start + window.start, span.end + window.start, span.label, span.score)
                for span in spans
                if window.own_start <= span.start + window.start < window.own_stop
            )
            tokens[row.item] = tokens.get(row.item, 0) + len(row.tokens)
        for index, spans in found.items():
            request = requests[index]
            kept = resolve_overlaps(spans, request.flat, request.multi_label, self.max_width)
            entities = [_entity(request, span) for span in kept]
            if request.merge:
                entities = merge_adjacent(entities, request.text)
            results[index] = ItemResult(_extract_result(entities), input_tokens=tokens[index])


def _entity(request: _Request, span: Span) -> dict[str, Any]:
    start, end = request.words[span.start].start, request.words[span.end].end
    return {"text": request.text[start:end], "label": request.labels[span.label], "score": span.score,
            "start": start, "end": end, "bbox": None}  # fmt: skip


def _extract_result(entities: list[dict]) -> dict[str, Any]:
    return {"entities": entities, "relations": [], "classifications": [], "objects": [], "data": {}}
