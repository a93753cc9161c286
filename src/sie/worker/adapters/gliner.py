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
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs
import numpy as np

from sie.catalog.adapters import GLINER
from sie.tokenization import TextTokenizer, TokenizedWords, pad_batch
from sie.wire import codes
from sie.worker.adapters.base import Adapter, AdapterContext, BatchResult, ItemResult, Stopwatch, entity_result, invalid
from sie.worker.adapters.encoder import item_text
from sie.worker.adapters.zero_shot import marked_prompt, prompts_by_label_set, split_requests, zero_shot_refusal
from sie.worker.convert.names import (
    GLINER_CONFIG_FILE,
    LABEL_EMBEDDINGS,
    LABEL_POSITIONS,
    LABELS_TOKENIZER_DIR,
    SPAN_SCORES,
    TOKEN_SCORES,
    TOKENIZER_FILE,
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
    token_spans,
)

DEFAULT_THRESHOLD = 0.5
# Most windows one text is read in (about 40,000 words at 384 a window): a longer text is refused, not read in part.
MAX_WINDOWS = 128
# The words windows of a token-level model share at least twice this (its spans have no width of their own).
TOKEN_SPAN_WIDTH = 16
# A bi-encoder's label embeddings kept between requests, and the tokens of one label its encoder reads.
LABEL_CACHE_SIZE = 4096
LABEL_MAX_TOKENS = 512


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


class LabelEncoder:
    """A bi-encoder GLiNER's label graph and tokenizer, with the embedding of every label it has encoded kept (up to
    LABEL_CACHE_SIZE, least recently used first out): a label set asked for again is not encoded again."""

    def __init__(self, session: Any, tokenizer: TextTokenizer) -> None:
        self._session = session
        self._inputs = {node.name for node in session.get_inputs()}
        self._tokenizer = tokenizer
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def of(cls, context: AdapterContext) -> LabelEncoder:
        session = context.extra_sessions.get("labels")
        path = context.model_dir / LABELS_TOKENIZER_DIR / TOKENIZER_FILE if context.model_dir is not None else None
        if session is None or path is None or not path.is_file():
            raise ValueError(f"a bi-encoder GLiNER needs its label graph and {LABELS_TOKENIZER_DIR}/{TOKENIZER_FILE}")
        return cls(session, TextTokenizer.from_file(path, max_length=LABEL_MAX_TOKENS))

    def rows(self, label_sets: list[list[str]]) -> np.ndarray:
        """[rows, most labels, width]: each row's labels' embeddings in order, zeros past its last."""
        distinct = list(dict.fromkeys(label for labels in label_sets for label in labels))
        embedded = self.embeddings(distinct)
        width = next(iter(embedded.values())).shape[0]
        out = np.zeros((len(label_sets), max(map(len, label_sets)), width), dtype=np.float32)
        for row, labels in enumerate(label_sets):
            for column, label in enumerate(labels):
                out[row, column] = embedded[label]
        return out

    def embeddings(self, labels: list[str]) -> dict[str, np.ndarray]:
        with self._lock:
            found = {label: self._cache[label] for label in labels if label in self._cache}
            for label in found:
                self._cache.move_to_end(label)
        missing = [label for label in labels if label not in found]
        if missing:
            tokens = self._tokenizer.encode_batch(missing)
            batch = pad_batch([t.input_ids for t in tokens], [t.token_type_ids for t in tokens], self._tokenizer.pad_id)
            feeds = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                     "token_type_ids": batch.token_type_ids}  # fmt: skip
            (encoded,) = self._session.run([LABEL_EMBEDDINGS], {k: v for k, v in feeds.items() if k in self._inputs})
            with self._lock:
                for label, vector in zip(missing, encoded.astype(np.float32), strict=True):
                    found[label] = self._cache[label] = vector
                while len(self._cache) > LABEL_CACHE_SIZE:
                    self._cache.popitem(last=False)
        return found


class GlinerAdapter(Adapter):
    """`sie.adapters.gliner`: extract only; the labels come with each request."""

    kind: ClassVar[str | None] = GLINER
    supports_extract: ClassVar[bool] = True

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        self.settings = PromptSettings.read(context)
        outputs = {node.name: node for node in self.session.get_outputs()}
        # A token-level model scores words, not spans: its spans are as wide as they come, unless max_width asks.
        self._token_level = TOKEN_SCORES in outputs
        self.max_width = TOKEN_SPAN_WIDTH if self._token_level else int(outputs[SPAN_SCORES].shape[2])
        # A bi-encoder reads its labels with a label encoder of its own, not in the text's prompt.
        self._label_encoder = LabelEncoder.of(context) if LABEL_EMBEDDINGS in self._input_names else None
        # Windows share enough words that a span owned by one never reaches its edge.
        self.overlap = max(2 * self.max_width, 32)

    def extract(self, items: Sequence[Any]) -> BatchResult:
        watch = Stopwatch()
        results, requests = split_requests(items, self._request)
        if requests:
            with watch.stage("tokenization"):
                rows = self._rows(requests, results)
            if rows:
                with watch.stage("inference"):
                    scores = self._scores(rows, requests)
                with watch.stage("postprocessing"):
                    self._answer(requests, rows, scores, results)
        return watch.finish(results)

    def _request(self, item: Any) -> _Request | ItemResult:
        refused = zero_shot_refusal(self, item)
        if refused is not None:
            return refused
        text = item_text(item.item) or ""
        options = self.options_for(item.options)
        widest = len(text) if self._token_level else self.max_width  # a word has a character at least
        max_width = options.get("max_width") or widest
        return _Request(
            text=text,
            words=split_words(text),
            labels=list(dict.fromkeys(item.labels)),  # gliner reads a repeated label once
            threshold=float(options.get("threshold", DEFAULT_THRESHOLD)),
            flat=bool(options.get("flat_ner", True)),
            multi_label=bool(options.get("multi_label", False)),
            max_width=min(int(max_width), widest),
            merge=bool(options.get("merge_adjacent_entities", False)),
        )

    def _prompt(self, labels: list[str]) -> list[str]:
        if self._label_encoder is not None:
            return []
        return marked_prompt(labels, self.settings.ent_token, self.settings.sep_token)

    def _rows(self, requests: dict[int, _Request], results: list[ItemResult]) -> list[_Row]:
        """Every item's windows, encoded with its prompt; an item whose labels leave no room for its text, or whose
        text needs more than MAX_WINDOWS windows, gets its error instead."""
        planned: list[tuple[int, Window, list[str]]] = []
        # Each distinct label set's prompt is encoded once, and every text's word lengths in one call.
        prompts = prompts_by_label_set(self.tokenizer, [r.labels for r in requests.values()], self._prompt)
        word_counts = self.tokenizer.word_token_counts([[w.text for w in r.words] for r in requests.values()])
        for (index, request), counts in zip(requests.items(), word_counts, strict=True):
            prompt = prompts[tuple(request.labels)]
            refused = prompt.refusal(len(request.labels))
            if refused is not None:
                results[index] = refused
                continue
            windows = plan_windows(counts, self.settings.max_len, prompt.room, self.overlap)
            if len(windows) > MAX_WINDOWS:
                results[index] = invalid(
                    f"The text has {len(request.words)} words: more than {MAX_WINDOWS} windows of this model's "
                    f"{self.settings.max_len} words; split it into shorter items", codes.INPUT_TOO_LONG
                )  # fmt: skip
                continue
            planned += [(index, window, prompt.words) for window in windows]
        encoded = self.tokenizer.encode_words(
            [prompt + [word.text for word in requests[index].words[window.start : window.stop]]
             for index, window, prompt in planned]
        )  # fmt: skip
        rows = []
        for (index, window, prompt), tokens in zip(planned, encoded, strict=True):
            first = tokens.first_tokens()
            shift = 0 if self.settings.embed_ent_token else 1
            labels = [first[marker] + shift for marker in range(0, len(prompt) - 1, 2)] if prompt else []
            words = [first.get(len(prompt) + offset, 0) for offset in range(window.stop - window.start)]
            rows.append(_Row(index, window, tokens, words, labels))
        return rows

    def _scores(self, rows: list[_Row], requests: dict[int, _Request]) -> np.ndarray:
        batch = pad_batch([row.tokens.input_ids for row in rows], None, self.tokenizer.pad_id)
        words = max(len(row.word_positions) for row in rows)
        word_positions = np.zeros((len(rows), words), dtype=np.int64)
        for number, row in enumerate(rows):
            word_positions[number, : len(row.word_positions)] = row.word_positions
        feeds = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "token_type_ids": batch.token_type_ids,
            WORD_POSITIONS: word_positions,
            WORD_COUNTS: np.array([len(row.word_positions) for row in rows], dtype=np.int64),
        }
        if self._label_encoder is not None:
            feeds[LABEL_EMBEDDINGS] = self._label_encoder.rows([requests[row.item].labels for row in rows])
        else:
            label_positions = np.zeros((len(rows), max(len(row.label_positions) for row in rows)), dtype=np.int64)
            for number, row in enumerate(rows):
                label_positions[number, : len(row.label_positions)] = row.label_positions
            feeds[LABEL_POSITIONS] = label_positions
        (scores,) = self.run_session(feeds, [TOKEN_SCORES if self._token_level else SPAN_SCORES])
        return scores.astype(np.float32, copy=False)

    def _answer(
        self, requests: dict[int, _Request], rows: list[_Row], scores: np.ndarray, results: list[ItemResult]
    ) -> None:
        found: dict[int, list[Span]] = {}
        tokens: dict[int, int] = {}
        for number, row in enumerate(rows):
            request = requests[row.item]
            window = row.window
            words = window.stop - window.start
            if self._token_level:
                spans = token_spans(scores[number], words, len(request.labels), request.threshold, request.max_width)
            else:
                spans = candidate_spans(scores[number], words, len(request.labels), request.threshold,
                                        request.max_width, request.multi_label)  # fmt: skip
            found.setdefault(row.item, []).extend(
                Span(span.start + window.start, span.end + window.start, span.label, span.score)
                for span in spans
                if window.own_start <= span.start + window.start < window.own_stop
            )
            tokens[row.item] = tokens.get(row.item, 0) + len(row.tokens)
        for index, spans in found.items():
            request = requests[index]
            widest = len(request.words) if self._token_level else self.max_width
            kept = resolve_overlaps(spans, request.flat, request.multi_label, widest)
            entities = [_entity(request, span) for span in kept]
            if request.merge:
                entities = merge_adjacent(entities, request.text)
            results[index] = ItemResult(entity_result(entities), input_tokens=tokens[index])


def _entity(request: _Request, span: Span) -> dict[str, Any]:
    start, end = request.words[span.start].start, request.words[span.end].end
    return {"text": request.text[start:end], "label": request.labels[span.label], "score": span.score,
            "start": start, "end": end, "bbox": None}  # fmt: skip
