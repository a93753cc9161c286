"""Zero-shot entity extraction with a GLiNER span model: each text is split into words, prefixed with the request's
labels as GLiNER's prompt (`<<ENT>> label … <<SEP>>`) and encoded word by word; the converted graph
(`sie.worker.convert.gliner`) scores every span of up to `max_width` words against every label, and spans are picked
and their overlaps resolved as the `gliner` package does (`sie.worker.spans`). A text longer than the model reads at
once (`max_len` words, or the tokens the labels leave) is read in overlapping windows, each span taken from the
window that holds it away from an edge, so offsets stay those of the whole text. Rows of one batch may carry
different label sets: each row's label markers are found where its own prompt put them.

A relation-extraction model ("relex") also reads the request's relation types (`relation_labels`) in its prompt
(`<<ENT>> label … <<SEP>> <<REL>> type … <<SEP>>`) and returns the relations between the entities it finds
(`sie.worker.adapters.gliner_relations`): head, tail, relation and score, best first; a text read in several windows
has each (head, tail, relation) once, at its best score, as the public server returns them.
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
from sie.worker.adapters.gliner_relations import Relation, RelationScorer, RowRelations, relation_candidates
from sie.worker.adapters.zero_shot import (
    Prompt,
    marked_prompt,
    prompts_by_label_set,
    split_requests,
    zero_shot_refusal,
)
from sie.worker.convert.names import (
    GLINER_CONFIG_FILE,
    LABEL_EMBEDDINGS,
    LABEL_POSITIONS,
    LABELS_TOKENIZER_DIR,
    RELATION_EMBEDDINGS,
    RELATION_POSITIONS,
    SPAN_SCORES,
    TOKEN_SCORES,
    TOKENIZER_FILE,
    WORD_COUNTS,
    WORD_EMBEDDINGS,
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
    rel_token: str = "<<REL>>"
    embed_rel_token: bool = True

    @classmethod
    def read(cls, context: AdapterContext) -> PromptSettings:
        path = context.model_dir / GLINER_CONFIG_FILE if context.model_dir is not None else None
        if path is None or not path.is_file():
            raise ValueError(f"no {GLINER_CONFIG_FILE} beside the model")
        raw = json.loads(path.read_text(encoding="utf-8"))
        return cls(int(raw.get("max_len", 384)), str(raw.get("ent_token", "<<ENT>>")),
                   str(raw.get("sep_token", "<<SEP>>")), bool(raw.get("embed_ent_token", True)),
                   str(raw.get("rel_token", "<<REL>>")), bool(raw.get("embed_rel_token", True)))  # fmt: skip


@attrs.frozen
class _Row:
    """One window of one item's text, encoded with its prompt."""

    item: int
    window: Window
    tokens: TokenizedWords
    word_positions: list[int]
    label_positions: list[int]
    relation_positions: list[int]


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
    relation_labels: list[str]
    relation_threshold: float

    @property
    def prompt_key(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return tuple(self.labels), tuple(self.relation_labels)


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
        # A relation-extraction model reads relation types in its prompt and has a relation graph beside it.
        self._relations: RelationScorer | None = None
        if RELATION_POSITIONS in self._input_names:
            session = context.extra_sessions.get("relations")
            if session is None:
                raise ValueError("a GLiNER relation-extraction model needs its relation graph beside it")
            self._relations = RelationScorer(session)

    def extract(self, items: Sequence[Any]) -> BatchResult:
        watch = Stopwatch()
        results, requests = split_requests(items, self._request)
        if requests:
            with watch.stage("tokenization"):
                rows = self._rows(requests, results)
            if rows:
                with watch.stage("inference"):
                    scores, embeddings = self._scores(rows, requests)
                    relations = self._relations_of(rows, requests, scores, embeddings)
                with watch.stage("postprocessing"):
                    self._answer(requests, rows, scores, results, relations)
        return watch.finish(results)

    def _request(self, item: Any) -> _Request | ItemResult:
        refused = zero_shot_refusal(self, item)
        if refused is not None:
            return refused
        text = item_text(item.item) or ""
        options = self.options_for(item.options)
        widest = len(text) if self._token_level else self.max_width  # a word has a character at least
        max_width = options.get("max_width") or widest
        threshold = float(options.get("threshold", DEFAULT_THRESHOLD))
        relation_labels = list(dict.fromkeys(options.get("relation_labels") or []))
        if relation_labels and self._relations is None:
            return invalid(f"Model '{self.model.sie_id}' does not extract relations (its gliner_config.json sets no "
                           "relations_layer); options.relation_labels needs a joint entity-relation model such as "
                           "knowledgator/gliner-relex-large-v1.0")  # fmt: skip
        return _Request(
            text=text,
            words=split_words(text),
            labels=list(dict.fromkeys(item.labels)),  # gliner reads a repeated label once
            threshold=threshold,
            flat=bool(options.get("flat_ner", True)),
            multi_label=bool(options.get("multi_label", False)),
            max_width=min(int(max_width), widest),
            merge=bool(options.get("merge_adjacent_entities", False)),
            relation_labels=relation_labels,
            # gliner's own default: the entity threshold (a YAML's runtime options may set another)
            relation_threshold=float(options.get("relation_threshold", threshold)),
        )

    def _prompt(self, labels: Sequence[str], relation_labels: Sequence[str] = ()) -> list[str]:
        if self._label_encoder is not None:
            return []
        words = marked_prompt(labels, self.settings.ent_token, self.settings.sep_token)
        if self._relations is None:
            return words
        # a relex model's prompt always has its relation part, even with no relation types
        return words + marked_prompt(relation_labels, self.settings.rel_token, self.settings.sep_token)

    def _rows(self, requests: dict[int, _Request], results: list[ItemResult]) -> list[_Row]:
        """Every item's windows, encoded with its prompt; an item whose labels leave no room for its text, or whose
        text needs more than MAX_WINDOWS windows, gets its error instead."""
        planned: list[tuple[int, Window, Prompt]] = []
        # Each distinct label set's prompt is encoded once, and every text's word lengths in one call.
        prompts = prompts_by_label_set(self.tokenizer, [r.prompt_key for r in requests.values()],
                                       lambda key: self._prompt(*key))  # fmt: skip
        word_counts = self.tokenizer.word_token_counts([[w.text for w in r.words] for r in requests.values()])
        for (index, request), counts in zip(requests.items(), word_counts, strict=True):
            prompt = prompts[request.prompt_key]
            labels = len(request.labels) + len(request.relation_labels)
            refused = prompt.refusal(labels, "labels and relation types" if request.relation_labels else "labels")
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
            planned += [(index, window, prompt) for window in windows]
        encoded = self.tokenizer.encode_words(
            [prompt.words + [word.text for word in requests[index].words[window.start : window.stop]]
             for index, window, prompt in planned]
        )  # fmt: skip
        rows = []
        for (index, window, prompt), tokens in zip(planned, encoded, strict=True):
            first = tokens.first_tokens()
            request, prompt_words = requests[index], len(prompt.words)
            labels, relations = [], []
            if prompt_words:  # markers at 0, 2, … then (relex) past the separator at 2n + 1, 2n + 3, …
                shift = 0 if self.settings.embed_ent_token else 1
                labels = [first[2 * label] + shift for label in range(len(request.labels))]
                shift = 0 if self.settings.embed_rel_token else 1
                after = 2 * len(request.labels) + 1
                relations = [first[after + 2 * kind] + shift for kind in range(len(request.relation_labels))]
            words = [first.get(prompt_words + offset, 0) for offset in range(window.stop - window.start)]
            rows.append(_Row(index, window, tokens, words, labels, relations))
        return rows

    def _scores(
        self, rows: list[_Row], requests: dict[int, _Request]
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        """The span (or token) scores of every row, and, when a row asks for relations, every row's word and relation
        type embeddings for the relation graph."""
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
        outputs = [TOKEN_SCORES if self._token_level else SPAN_SCORES]
        if self._relations is not None:
            relation_positions = np.zeros((len(rows), max(1, *(len(row.relation_positions) for row in rows))),
                                          dtype=np.int64)  # fmt: skip
            for number, row in enumerate(rows):
                relation_positions[number, : len(row.relation_positions)] = row.relation_positions
            feeds[RELATION_POSITIONS] = relation_positions
            if any(requests[row.item].relation_labels for row in rows):
                outputs += [WORD_EMBEDDINGS, RELATION_EMBEDDINGS]
        scores, *embeddings = self.run_session(feeds, outputs)
        return scores.astype(np.float32, copy=False), (embeddings[0], embeddings[1]) if embeddings else None

    def _relations_of(
        self,
        rows: list[_Row],
        requests: dict[int, _Request],
        scores: np.ndarray,
        embeddings: tuple[np.ndarray, np.ndarray] | None,
    ) -> dict[int, list[Relation]]:
        """The relations of each row (by its number) whose request names relation types."""
        if self._relations is None or embeddings is None:
            return {}
        words, types = embeddings
        asked: dict[int, RowRelations] = {}
        for number, row in enumerate(rows):
            request = requests[row.item]
            if not request.relation_labels:
                continue
            count = row.window.stop - row.window.start
            candidates = relation_candidates(scores[number], count, len(request.labels), request.threshold,
                                             request.max_width)  # fmt: skip
            asked[number] = RowRelations(words[number, :count], types[number, : len(request.relation_labels)],
                                         candidates, len(request.relation_labels), request.threshold,
                                         request.relation_threshold)  # fmt: skip
        return dict(zip(asked, self._relations.relations(list(asked.values())), strict=True))

    def _answer(
        self,
        requests: dict[int, _Request],
        rows: list[_Row],
        scores: np.ndarray,
        results: list[ItemResult],
        relations: dict[int, list[Relation]],
    ) -> None:
        found: dict[int, list[Span]] = {}
        tokens: dict[int, int] = {}
        related: dict[int, list[dict[str, Any]]] = {}
        windows: dict[int, int] = {}
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
            windows[row.item] = windows.get(row.item, 0) + 1
            if number in relations:
                # gliner keeps a relation between entities its decoding of this window kept
                kept = {(span.start, span.end) for span in resolve_overlaps(spans, request.flat, request.multi_label,
                                                                            self.max_width)}  # fmt: skip
                related.setdefault(row.item, []).extend(
                    _relation(request, window, relation)
                    for relation in relations[number]
                    if relation.head in kept and relation.tail in kept
                )
        for index, spans in found.items():
            request = requests[index]
            widest = len(request.words) if self._token_level else self.max_width
            kept = resolve_overlaps(spans, request.flat, request.multi_label, widest)
            entities = [_entity(request, span) for span in kept]
            if request.merge:
                entities = merge_adjacent(entities, request.text)
            result = entity_result(entities)
            result["relations"] = _best_first(related.get(index, []), several_windows=windows[index] > 1)
            results[index] = ItemResult(result, input_tokens=tokens[index])


def _entity(request: _Request, span: Span) -> dict[str, Any]:
    start, end = request.words[span.start].start, request.words[span.end].end
    return {"text": request.text[start:end], "label": request.labels[span.label], "score": span.score,
            "start": start, "end": end, "bbox": None}  # fmt: skip


def _relation(request: _Request, window: Window, relation: Relation) -> dict[str, Any]:
    def text(span: tuple[int, int]) -> str:
        first, last = request.words[window.start + span[0]], request.words[window.start + span[1]]
        return request.text[first.start : last.end]

    return {"head": text(relation.head), "tail": text(relation.tail),
            "relation": request.relation_labels[relation.type], "score": relation.score}  # fmt: skip


def _best_first(relations: list[dict[str, Any]], several_windows: bool) -> list[dict[str, Any]]:
    """Relations by descending score (then type, head, tail), as the public server orders them; a text read in several
    windows has each (head, tail, relation) once, at its best score."""
    if several_windows:
        best: dict[tuple[str, str, str], dict[str, Any]] = {}
        for relation in relations:
            key = (relation["head"], relation["tail"], relation["relation"])
            if key not in best or relation["score"] > best[key]["score"]:
                best[key] = relation
        relations = list(best.values())
    return sorted(relations, key=lambda one: (-one["score"], one["relation"], one["head"], one["tail"]))
