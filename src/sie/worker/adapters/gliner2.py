"""Zero-shot entity extraction, relation extraction and text classification with a GLiNER2 span model, as the
`gliner2` package runs one: the text (a sentence end added when it has none) is split into lower-cased words; the
request's labels become schemas — `( [P] entities ( [E] label … ) )`; with a classification task
`( [P] task ( [L] label … ) )`; for relations, one `( [P] type ( [R] head [R] tail ) )` per relation type, joined by
`[SEP_STRUCT]` — read before `[SEP_TEXT]` and the words, every word and schema part tokenized on its own, no special
tokens around them. The converted graph (`sie.worker.convert.gliner2`) predicts how many instances of each schema the
text holds, scores every span of up to `max_width` words against each field of each instance, and gives each field
marker a classifier logit. Entities: none when the count head sees none, else each label's spans at or above the
threshold, kept best-first where they do not overlap one of the label's kept spans. Relations (the items name their
entities in `metadata.entities`, as for GLiREL): each predicted instance of a type is its best head and tail span,
kept where both are entities the item names, scored by the lower of the two. Classification: a softmax over the
labels (the best one), or a sigmoid each with `multi_label` (those at or above the threshold, else the best).

Structured extraction (`output_schema`, `sie.catalog.output_schema`): the schema's properties are the fields of one
structure, `( [P] _sie_root [DESCRIPTION] name: description … ( [C] field … ) )`, as the public server names it; an
enum property's values are read from a prefix before the words, `( _sie_root: field ( a | b ) , … )`. Each instance
the count head predicts gives every field its value: a string property the best span at or above the threshold (the
spans ranked best-first, one dropped where it overlaps a better one), an array every such span (repeats of a text
dropped), an enum the value whose prefix word scores best, if that reaches the threshold. An instance with no value
is dropped; the answer's `data` is the first instance (null and [] where a field found nothing), or {} when there is
none.

A text longer than one row is read in windows: entities from the window that owns their first word, relations from
every window (one per type, head and tail, at its best score); a classification pooled over its windows (each
label's best score; with `positive_label`, a text takes that label when any window does); a structure from each
window's first instance: a text field's spans of every window ranked and kept as one window's are (an array their
texts, a string the best one's), an enum field the best-scoring value of any window.
"""

from __future__ import annotations

import bisect
import functools
import re
import sys
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Final

import attrs
import numpy as np

from sie.catalog.adapters import GLINER2
from sie.catalog.decisions import DecisionRequest
from sie.catalog.options import MAX_LABEL_CHARS, entities_problem, option_problem
from sie.catalog.output_schema import StructureField, structure_fields
from sie.tokenization import pad_batch
from sie.wire import codes
from sie.wire.ipc_batch import OP_EXTRACT
from sie.worker.adapters.base import Adapter, AdapterContext, BatchResult, ItemResult, Stopwatch, invalid
from sie.worker.adapters.encoder import item_text
from sie.worker.adapters.zero_shot import split_requests, zero_shot_refusal
from sie.worker.convert.names import (
    CLASS_LOGITS,
    COUNT_LOGITS,
    FIELD_COUNTS,
    INSTANCES,
    SCHEMA_POSITIONS,
    SPAN_SCORES,
    WORD_COUNTS,
    WORD_POSITIONS,
)
from sie.worker.spans import Window, plan_windows

DEFAULT_THRESHOLD = 0.5
ENTITY_TASK: Final = "entities"
ENTITY_MARKER, LABEL_MARKER, RELATION_MARKER, TASK_MARKER = "[E]", "[L]", "[R]", "[P]"
STRUCT_MARKER, TEXT_MARKER = "[SEP_STRUCT]", "[SEP_TEXT]"
FIELD_MARKER, DESCRIPTION_MARKER = "[C]", "[DESCRIPTION]"
# The structure an output schema's properties form (the public server's name for it: the model reads it).
ROOT_STRUCTURE: Final = "_sie_root"
RELATION_FIELDS = ("head", "tail")
# The most instances of a schema the count head can predict (its classes are 0 … 19): what relation rows score.
MAX_INSTANCES = 19
SENTENCE_ENDS = (".", "!", "?")
# Most windows one text is read in; a longer text is refused, not read in part.
MAX_WINDOWS = 128
# Words consecutive classification windows share, so a sentence cut by one window's edge is read whole by the next.
CLASSIFY_OVERLAP_WORDS = 64
# The options a profile's load-time options may set (the public adapter's), and the ones a request may change.
LOADTIME_OPTIONS: Final = ("threshold", "classification_task", "default_labels", "multi_label", "positive_label")


@functools.cache
def word_pattern() -> re.Pattern[str]:
    """gliner2's WhitespaceTokenSplitter: links, e-mail addresses, handles, words (joined by - or _; combining marks
    and zero-width joiners belong to a word), or one other character. Made on first use: listing the combining
    marks reads every code point (about 0.4 s), which only a GLiNER2 model needs."""
    marks = "".join(chr(code) for code in range(sys.maxunicode + 1) if unicodedata.category(chr(code)).startswith("M"))
    word = rf"[\w{marks}\u200c\u200d]"
    return re.compile(
        rf"""(?:https?://[^\s]+|www\.[^\s]+)
        |[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{{2,}}
        |@[a-z0-9_]+
        |{word}+(?:[-_]{word}+)*
        |\S""",
        re.VERBOSE | re.IGNORECASE,
    )


@attrs.frozen
class Gliner2Word:
    """One word as gliner2 reads it: lower-cased, with its character offsets in the model's text."""

    text: str
    start: int
    end: int


def split_words(text: str) -> list[Gliner2Word]:
    return [Gliner2Word(match.group().lower(), match.start(), match.end()) for match in word_pattern().finditer(text)]


def model_text(text: str) -> str:
    """The text gliner2 reads: a sentence end added to one without (its words' offsets are the text's)."""
    return text if text.endswith(SENTENCE_ENDS) else text + "."


def schema_words(task: str, fields: Sequence[str], marker: str) -> list[str]:
    """One schema's parts: `( [P] task ( marker field … ) )`; its markers are parts 1 and 4, 6, …"""
    words = ["(", TASK_MARKER, task, "("]
    for field in fields:
        words += [marker, field]
    return [*words, ")", ")"]


@attrs.frozen
class Schema:
    """One schema of a row: its task, its fields (labels, or a relation's head and tail) and their marker."""

    task: str
    fields: tuple[str, ...]
    marker: str


def row_prefix(schemas: Sequence[Schema]) -> tuple[list[str], list[list[int]]]:
    """The parts a row reads before its words — the schemas joined by `[SEP_STRUCT]`, then `[SEP_TEXT]` — and each
    schema's marker parts ([P], then each field's)."""
    words: list[str] = []
    markers = []
    for index, schema in enumerate(schemas):
        if index:
            words.append(STRUCT_MARKER)
        markers.append([len(words) + 1, *range(len(words) + 4, len(words) + 4 + 2 * len(schema.fields), 2)])
        words += schema_words(schema.task, schema.fields, schema.marker)
    return [*words, TEXT_MARKER], markers


def structure_lead(fields: Sequence[StructureField]) -> tuple[str, ...]:
    """The words a structure row reads before the text's: its enum values, `( _sie_root: field ( a | b ) , … )`
    (none without an enum field), as gliner2 prefixes them."""
    inner: list[str] = []
    for field in fields:
        if field.choices is not None:
            separated = [part for choice in field.choices for part in ("|", choice)][1:]
            inner += [",", field.name, "(", *separated, ")"]
    return ("(", f"{ROOT_STRUCTURE}:", *inner[1:], ")") if inner else ()


@attrs.frozen
class Settings:
    """One request's settings: the profile's load-time and runtime options, then the request's."""

    threshold: float = DEFAULT_THRESHOLD
    classification_task: str | None = None
    default_labels: tuple[str, ...] = ()
    multi_label: bool = False
    positive_label: str | None = None

    @classmethod
    def read(cls, options: Mapping[str, Any]) -> Settings:
        """The settings `options` ask for; ValueError naming the first that cannot be read."""
        given = {key: options[key] for key in LOADTIME_OPTIONS if options.get(key) is not None}
        problem = option_problem({k: v for k, v in given.items() if k != "default_labels"}, GLINER2, OP_EXTRACT)
        if problem is not None:
            raise ValueError(problem)
        labels = given.get("default_labels", ())
        if not isinstance(labels, list | tuple) or not all(isinstance(x, str) and x.strip() for x in labels):
            raise ValueError("Option 'default_labels' must be a list of non-blank labels")
        return cls(float(given.get("threshold", DEFAULT_THRESHOLD)), given.get("classification_task"),
                   tuple(labels), bool(given.get("multi_label", False)), given.get("positive_label"))  # fmt: skip


@attrs.frozen
class Gliner2Request:
    """One valid item: its text as read, words, labels, what it asks and its settings."""

    text: str
    read: str
    words: list[Gliner2Word]
    labels: list[str]
    task: str | None  # the classification task, or None
    settings: Settings
    entities: list[dict[str, Any]] | None = None  # relations: the entities the item names (`metadata.entities`)
    structure: tuple[StructureField, ...] | None = None  # structured extraction: the output schema's fields
    lead: tuple[str, ...] = ()  # words read before the text's (`structure_lead`)
    decision: DecisionRequest | None = None  # a typed-decision model's tasks (`gliner2_decide.py`)

    @property
    def counts_instances(self) -> bool:
        """Whether the request reads every instance the count head predicts (relations, structures)."""
        return self.entities is not None or self.structure is not None

    @property
    def schemas(self) -> list[Schema]:
        if self.decision is not None:
            return [Schema(task.schema_prompt, task.labels, LABEL_MARKER) for task in self.decision.tasks]
        if self.structure is not None:
            prompt = ROOT_STRUCTURE + "".join(f" {DESCRIPTION_MARKER} {field.name}: {field.description}"
                                              for field in self.structure if field.description)  # fmt: skip
            return [Schema(prompt, tuple(field.name for field in self.structure), FIELD_MARKER)]
        if self.entities is not None:
            return [Schema(label, RELATION_FIELDS, RELATION_MARKER) for label in self.labels]
        if self.task is not None:
            return [Schema(self.task, tuple(self.labels), LABEL_MARKER)]
        return [Schema(ENTITY_TASK, tuple(self.labels), ENTITY_MARKER)]


@attrs.frozen
class _Row:
    """One window of one item's words, tokenized behind its schemas."""

    item: int
    window: Window
    ids: np.ndarray
    word_positions: list[int]
    marker_positions: list[list[int]]  # per schema: [P], then each field's marker


class Gliner2Adapter(Adapter):
    """`sie.adapters.gliner2`: extract only; entities, relations between the entities an item names, or
    classifications with a classification task."""

    kind: ClassVar[str | None] = GLINER2
    supports_extract: ClassVar[bool] = True

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        outputs = {node.name: node for node in self.session.get_outputs()}
        if SPAN_SCORES not in outputs:
            raise ValueError("the graph is not a converted GLiNER2 span model")
        self.max_width = int(outputs[SPAN_SCORES].shape[2])
        missing = [
            marker
            for marker in (ENTITY_MARKER, LABEL_MARKER, RELATION_MARKER, TASK_MARKER, STRUCT_MARKER, TEXT_MARKER)
            if self.tokenizer.token_to_id(marker) is None
        ]
        if missing:
            raise ValueError(f"the tokenizer lacks GLiNER2's markers {missing}")
        self.loadtime = {
            key: value for key, value in context.profile.loadtime_options.items() if key in LOADTIME_OPTIONS
        }
        Settings.read({**self.loadtime, **self.runtime_options})  # the profile's own options must be readable

    def extract(self, items: Sequence[Any]) -> BatchResult:
        watch = Stopwatch()
        results, requests = split_requests(items, self._request)
        if requests:
            with watch.stage("tokenization"):
                rows = self._rows(requests, results)
            if rows:
                # Relation and structure rows score every instance the count head can predict; the others the first.
                instances = MAX_INSTANCES if any(requests[row.item].counts_instances for row in rows) else 1
                with watch.stage("inference"):
                    outputs = self._run(rows, instances)
                with watch.stage("postprocessing"):
                    self._answer(requests, rows, outputs, instances, results)
        return watch.finish(results)

    def _request(self, item: Any) -> Gliner2Request | ItemResult:
        refused = zero_shot_refusal(self, item)
        if refused is not None:
            return refused
        try:
            settings = Settings.read({**self.loadtime, **self.options_for(item.options)})
        except ValueError as exc:
            return invalid(str(exc))
        if item.output_schema is not None:
            return self._structure_request(item, settings)
        labels = list(dict.fromkeys(label.strip() for label in (item.labels or settings.default_labels)))
        if not labels:
            return invalid(f"Model '{self.model.sie_id}' needs labels: send labels, or set default_labels")
        if settings.positive_label is not None and settings.positive_label not in labels:
            if (item.options or {}).get("positive_label") is not None:
                return invalid(f"Option 'positive_label' ({settings.positive_label!r}) must be one of the labels")
            settings = attrs.evolve(settings, positive_label=None)  # the profile's applies when the labels name it
        text = item_text(item.item) or ""
        read = model_text(text)
        metadata = item.item.get("metadata") if isinstance(item.item, dict) else None
        entities = metadata.get("entities") if isinstance(metadata, dict) else None
        if entities is not None:  # relations between the entities the item names, of the labels' types
            problem = entities_problem(text, entities)
            if problem is not None:
                return invalid(problem)
            return Gliner2Request(text, read, split_words(read), labels, None, settings, entities)
        return Gliner2Request(text, read, split_words(read), labels, settings.classification_task, settings)

    def _structure_request(self, item: Any, settings: Settings) -> Gliner2Request | ItemResult:
        """An item with an output schema (checked by `zero_shot_refusal`): its fields, read with no task."""
        if self.tokenizer.token_to_id(FIELD_MARKER) is None:
            return invalid(f"Model '{self.model.sie_id}': its tokenizer lacks {FIELD_MARKER}, the structure field "
                           "marker, so it cannot fill an output_schema")  # fmt: skip
        fields = structure_fields(item.output_schema, MAX_LABEL_CHARS)
        text = item_text(item.item) or ""
        read = model_text(text)
        settings = attrs.evolve(settings, classification_task=None)  # a profile's task is not this request's
        return Gliner2Request(text, read, split_words(read), [field.name for field in fields], None, settings,
                              structure=fields, lead=structure_lead(fields))  # fmt: skip

    def _rows(self, requests: dict[int, Gliner2Request], results: list[ItemResult]) -> list[_Row]:
        """Every item's windows behind its schemas; an item whose schemas leave no room for its words, or whose
        text needs more than MAX_WINDOWS windows, gets its error instead."""
        prefixes = {index: row_prefix(request.schemas) for index, request in requests.items()}
        strings = [part for words, _ in prefixes.values() for part in words]
        strings += [word.text for request in requests.values() for word in request.words]
        strings += [word for request in requests.values() for word in request.lead]
        pieces = self.tokenizer.pieces(strings)
        rows: list[_Row] = []
        for index, request in requests.items():
            prefix, markers = prefixes[index]
            prefix_ids = [pieces[part] for part in prefix]
            starts = np.cumsum([0, *(len(ids) for ids in prefix_ids)])
            # The lead words (a structure's enum values) follow [SEP_TEXT] in every window, read as words.
            lead_ids = [pieces[word] for word in request.lead]
            lead_starts = np.cumsum([int(starts[-1]), *(len(ids) for ids in lead_ids)])
            prompt = int(lead_starts[-1])
            room = self.tokenizer.max_length - prompt
            if room < 1:
                asked = "output_schema's fields and values" if request.structure else f"{len(request.labels)} labels"
                results[index] = invalid(
                    f"The {asked} take {prompt} of the model's {self.tokenizer.max_length} tokens and leave none for "
                    "the text: send fewer or shorter ones"
                )
                continue
            windows = self._windows(request, [pieces[word.text] for word in request.words], room)
            if len(windows) > MAX_WINDOWS:
                results[index] = invalid(
                    f"The text has {len(request.words)} words: more than {MAX_WINDOWS} windows of this model's "
                    f"{self.tokenizer.max_length} tokens; split it into shorter items", codes.INPUT_TOO_LONG
                )  # fmt: skip
                continue
            marker_positions = [[int(starts[part]) for part in schema] for schema in markers]
            for window in windows:
                ids, length, word_positions = [*prefix_ids, *lead_ids], prompt, [int(x) for x in lead_starts[:-1]]
                for word in request.words[window.start : window.stop]:
                    word_ids = pieces[word.text][: max(room - (length - prompt), 1)]
                    word_positions.append(length)
                    ids.append(word_ids)
                    length += len(word_ids)
                # A word of no tokens is read at the next word's first token (the last token at the end), as gliner2
                # reads it.
                word_positions = [min(position, length - 1) for position in word_positions]
                rows.append(_Row(index, window, np.concatenate(ids), word_positions, marker_positions))
        return rows

    def _windows(self, request: Gliner2Request, word_pieces: list[np.ndarray], room: int) -> list[Window]:
        """The windows `room` tokens each that read the request's words; consecutive windows share words (a span or
        sentence cut at one edge is read whole by the next), at most half of the narrowest, so each moves on."""
        counts = np.array([max(len(ids), 1) for ids in word_pieces], dtype=np.int64)
        windows = plan_windows(counts, self.tokenizer.max_length, room, 0)
        if len(windows) > 1:
            wanted = CLASSIFY_OVERLAP_WORDS if request.task else max(2 * self.max_width, 32)
            narrowest = min(window.stop - window.start for window in windows)
            windows = plan_windows(counts, self.tokenizer.max_length, room, min(wanted, narrowest // 2))
        return windows

    def _run(self, rows: list[_Row], instances: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        batch = pad_batch([row.ids for row in rows], None, self.tokenizer.pad_id)
        words = max(1, max(len(row.word_positions) for row in rows))
        schemas = max(len(row.marker_positions) for row in rows)
        markers = max(len(marker) for row in rows for marker in row.marker_positions)
        word_positions = np.zeros((len(rows), words), dtype=np.int64)
        marker_positions = np.zeros((len(rows), schemas, markers), dtype=np.int64)
        field_counts = np.zeros((len(rows), schemas), dtype=np.int64)
        for number, row in enumerate(rows):
            word_positions[number, : len(row.word_positions)] = row.word_positions
            for schema, positions in enumerate(row.marker_positions):
                marker_positions[number, schema, : len(positions)] = positions
                field_counts[number, schema] = len(positions) - 1
        feeds = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "token_type_ids": batch.token_type_ids,
            WORD_POSITIONS: word_positions,
            WORD_COUNTS: np.array([len(row.word_positions) for row in rows], dtype=np.int64),
            SCHEMA_POSITIONS: marker_positions,
            FIELD_COUNTS: field_counts,
        }
        shared = {INSTANCES: np.arange(instances, dtype=np.int64)}
        spans, counts, classes = self.run_session(feeds, [SPAN_SCORES, COUNT_LOGITS, CLASS_LOGITS], shared)
        return spans.astype(np.float32, copy=False), counts, classes.astype(np.float32, copy=False)

    def _answer(  # noqa: PLR0913 - the batch's requests, rows and outputs
        self,
        requests: dict[int, Gliner2Request],
        rows: list[_Row],
        outputs: tuple[np.ndarray, np.ndarray, np.ndarray],
        instances: int,
        results: list[ItemResult],
    ) -> None:
        """Each item's answer from its windows' outputs (span scores, count logits, class logits)."""
        spans, counts, classes = outputs
        fields = max(len(marker) for row in rows for marker in row.marker_positions) - 1
        found: dict[int, list[Any]] = {index: [] for index in requests}  # per item: candidates or window answers
        tokens = dict.fromkeys(requests, 0)
        for number, row in enumerate(rows):
            request = requests[row.item]
            tokens[row.item] += len(row.ids)
            if request.entities is not None:
                found[row.item] += _relations(spans[number], counts[number], row.window, request, instances, fields)
            elif request.structure is not None:
                found[row.item].append(_structures(spans[number], counts[number], row.window, request, instances,
                                                   fields))  # fmt: skip
            elif request.task is not None:
                found[row.item].append(_classified(classes[number, 0, : len(request.labels)], request))
            elif int(np.argmax(counts[number, 0])) > 0:  # the count head saw at least one instance
                found[row.item] += _candidates(spans[number, :, :, : len(request.labels)], row.window, request)
        for index in dict.fromkeys(row.item for row in rows):
            request = requests[index]
            if request.entities is not None:
                result = _result(_given_entities(request), [], _best_relations(found[index]))
            elif request.structure is not None:
                result = _result([], [], data=_flat_structure(found[index], request))
            elif request.task is not None:
                result = _result([], _pooled(found[index], request))
            else:
                result = _result(_decoded(found[index], request), [])
            results[index] = ItemResult(result, input_tokens=tokens[index])


def _spans_over(scores: np.ndarray, window: Window, request: Gliner2Request) -> Iterator[tuple[int, float, int, int]]:
    """The spans of a window's [words, widths] scores at or above the threshold that end within it and cover some
    text, as (first word, score, start, end) in the read text's characters, in gliner2's order (by start word, then
    width)."""
    words = window.stop - window.start
    starts, widths = np.nonzero(scores[:words] >= request.settings.threshold)
    for start, width in zip(starts.tolist(), widths.tolist(), strict=True):
        if start + width >= words:
            continue
        first = window.start + start
        begin, end = request.words[first].start, request.words[first + width].end
        if request.read[begin:end].strip():
            yield first, float(scores[start, width]), begin, end


def _candidates(scores: np.ndarray, window: Window, request: Gliner2Request) -> list[tuple[int, float, int, int]]:
    """Each label's spans of one window whose first word the window owns, as (label, score, start, end)."""
    return [
        (label, score, begin, end)
        for label in range(len(request.labels))
        for first, score, begin, end in _spans_over(scores[:, :, label], window, request)
        if window.own_start <= first < window.own_stop
    ]


def _decoded(candidates: list[tuple[int, float, int, int]], request: Gliner2Request) -> list[dict[str, Any]]:
    """Each label's spans best-first, a span dropped where it overlaps one of the label's kept spans; the entities of
    the text as sent (a span in the added sentence end dropped, one reaching it cut), by start."""
    entities = []
    by_label: dict[int, list[tuple[int, float, int, int]]] = {}
    for candidate in candidates:
        by_label.setdefault(candidate[0], []).append(candidate)
    for label in range(len(request.labels)):
        for _, score, start, end in _kept(by_label.get(label, [])):
            end = min(end, len(request.text))
            if start < end:
                entities.append({"text": request.text[start:end], "label": request.labels[label], "score": score,
                                 "start": start, "end": end, "bbox": None})  # fmt: skip
    return sorted(entities, key=lambda entity: entity["start"])


def _classified(logits: np.ndarray, request: Gliner2Request) -> list[tuple[str, float]]:
    """One window's classification as gliner2 returns it: the best label and its softmax probability, or with
    multi_label every label whose sigmoid reaches the threshold (else the best one)."""
    labels, threshold = request.labels, request.settings.threshold
    if request.settings.multi_label:
        probabilities = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
        chosen = [(labels[j], float(probabilities[j])) for j in range(len(labels)) if probabilities[j] >= threshold]
        best = int(np.argmax(probabilities))
        return chosen or [(labels[best], float(probabilities[best]))]
    shifted = np.exp(logits.astype(np.float64) - logits.max())
    probabilities = shifted / shifted.sum()
    best = int(np.argmax(probabilities))
    return [(labels[best], float(probabilities[best]))]


def _pooled(windows: list[list[tuple[str, float]]], request: Gliner2Request) -> list[dict[str, Any]]:
    """A text's classifications from its windows' (one window: as it is), those at or above the threshold, best
    first. Several windows: each label's best score (multi_label); else the window taking `positive_label` most
    surely — or, of two labels when none takes it, the window least sure of the other — else the surest window."""
    settings = request.settings
    if len(windows) == 1:
        pooled = windows[0]
    elif settings.multi_label:
        best: dict[str, float] = {}
        for found in windows:
            for label, score in found:
                best[label] = max(best.get(label, score), score)
        pooled = list(best.items())
    else:
        chosen = [found[0] for found in windows if found]
        positive = [one for one in chosen if one[0] == settings.positive_label]
        if positive:
            pooled = [max(positive, key=lambda one: one[1])]
        elif settings.positive_label is not None and len(request.labels) == 2:
            pooled = [min(chosen, key=lambda one: one[1])]
        else:
            pooled = [max(chosen, key=lambda one: one[1])]
    kept = [{"label": label, "score": score} for label, score in pooled if score >= settings.threshold]
    return sorted(kept, key=lambda one: one["score"], reverse=True)


def _relations(  # noqa: PLR0913 - one row's outputs and where its queries lie
    spans: np.ndarray, counts: np.ndarray, window: Window, request: Gliner2Request, instances: int, fields: int
) -> list[tuple[str, str, str, float]]:
    """One window's relations as (type, head, tail, score): for each type, each instance the count head predicts,
    the best head and tail span at or above the threshold; kept where both are texts of entities the item names,
    scored by the lower of the two."""
    words = window.stop - window.start
    named = {request.text[entity["start"] : entity["end"]] for entity in request.entities or ()}
    found = []
    for schema, relation in enumerate(request.labels):
        for instance in range(min(int(np.argmax(counts[schema])), instances)):
            ends = []
            for field in range(len(RELATION_FIELDS)):
                query = (schema * instances + instance) * fields + field
                ends.append(_best_span(spans[:words, :, query], window, request))
            head, tail = ends
            if head is not None and tail is not None and head[0] in named and tail[0] in named:
                found.append((relation, head[0], tail[0], min(head[1], tail[1])))
    return found


def _best_span(scores: np.ndarray, window: Window, request: Gliner2Request) -> tuple[str, float] | None:
    """The best-scoring span of a window's [words, widths] scores at or above the threshold, as (its text, score);
    None when there is none (the first of equal scores, as gliner2 keeps it)."""
    spans = list(_spans_over(scores, window, request))
    if not spans:
        return None
    _, score, begin, end = max(spans, key=lambda span: span[1])
    return request.read[begin:end].strip(), score


def _best_relations(found: list[tuple[str, str, str, float]]) -> list[dict[str, Any]]:
    """One relation per type, head and tail at its best score, best first (then by type, head and tail)."""
    best: dict[tuple[str, str, str], float] = {}
    for relation, head, tail, score in found:
        best[relation, head, tail] = max(best.get((relation, head, tail), score), score)
    ordered = sorted(best.items(), key=lambda item: (-item[1], *item[0]))
    return [{"head": head, "tail": tail, "relation": relation, "score": score}
            for (relation, head, tail), score in ordered]  # fmt: skip


def _given_entities(request: Gliner2Request) -> list[dict[str, Any]]:
    """The entities the item named, echoed as the answer's entities."""
    return [
        {"text": request.text[entity["start"] : entity["end"]], "label": entity.get("label") or "",
         "score": float(entity.get("score", 1.0)), "start": entity["start"], "end": entity["end"], "bbox": None}
        for entity in request.entities or ()
    ]  # fmt: skip


def _structures(  # noqa: PLR0913 - one row's outputs and where its queries lie
    spans: np.ndarray, counts: np.ndarray, window: Window, request: Gliner2Request, instances: int, fields: int
) -> list[dict[str, Any]]:
    """One window's instances of the request's structure, as gliner2 decodes them: for each instance the count head
    predicts, each text field's spans at or above the threshold that no better one overlaps (`_kept`), each enum
    field's value and score (`_chosen`); an instance with no value is dropped."""
    lead, words = len(request.lead), window.stop - window.start
    lowered = [word.lower() for word in request.lead]
    found = []
    for instance in range(min(int(np.argmax(counts[0])), instances)):
        values: dict[str, Any] = {}
        for index, field in enumerate(request.structure or ()):
            scores = spans[:, :, instance * fields + index]  # the row's one schema
            if field.choices is not None:
                values[field.name] = _chosen(scores[:lead, 0], field, lowered, request.settings.threshold)
            else:
                values[field.name] = _kept(list(_spans_over(scores[lead : lead + words], window, request)))
        if any(value for value in values.values()):
            found.append(values)
    return found


def _kept(spans: list[tuple[int, float, int, int]]) -> list[tuple[int, float, int, int]]:
    """Spans (first word or label, score, start, end) ranked best-first (the first of equal scores first), each
    dropped where its characters overlap a better one's: gliner2's greedy decoding."""
    kept: list[tuple[int, float, int, int]] = []
    # The kept spans never overlap, so by start they are by end too: a span overlaps one of them exactly when the
    # last kept span starting before its end ends after its start (a lookup, not a pass over every kept span).
    starts: list[int] = []
    ends: list[int] = []
    for span in sorted(spans, key=lambda span: span[1], reverse=True):
        before = bisect.bisect_left(starts, span[3])
        if before and ends[before - 1] > span[2]:
            continue
        kept.append(span)
        starts.insert(before, span[2])
        ends.insert(before, span[3])
    return kept


def _once(texts: list[str]) -> list[str]:
    """Each text the first time it occurs, compared by case (gliner2's repeats)."""
    seen: set[str] = set()
    kept = []
    for text in texts:
        if text.lower() not in seen:
            seen.add(text.lower())
            kept.append(text)
    return kept


def _chosen(
    scores: np.ndarray, field: StructureField, lowered: list[str], threshold: float
) -> tuple[str, float] | None:
    """An enum field's value: of its values, the one whose word in the lead (`lowered`) scores best (the first such
    word, by case, as gliner2 finds it; the first of equal scores), with its score, if that reaches the threshold."""
    best, best_score = None, -1.0
    for choice in field.choices or ():
        index = lowered.index(choice.lower()) if choice.lower() in lowered else -1
        if 0 <= index < len(scores) and float(scores[index]) > best_score:
            best, best_score = choice, float(scores[index])
    return (best, best_score) if best and best_score >= threshold else None


def _flat_structure(windows: list[list[dict[str, Any]]], request: Gliner2Request) -> dict[str, Any]:
    """The answer's `data` from each window's first instance: a text field's spans of every window ranked and kept
    as one window's are — an array their texts (each once, by case), a string the best one's (null: none) — and an
    enum field the best-scoring value of any window (null: none); {} when no window has an instance."""
    firsts = [found[0] for found in windows if found]
    if not firsts:
        return {}
    data: dict[str, Any] = {}
    for field in request.structure or ():
        values = [first[field.name] for first in firsts]
        if field.choices is not None:
            chosen = [value for value in values if value is not None]
            data[field.name] = max(chosen, key=lambda value: value[1])[0] if chosen else None
            continue
        texts = [request.read[begin:end].strip() for _, _, begin, end in _kept([s for v in values for s in v])]
        data[field.name] = _once(texts) if field.is_list else (texts[0] if texts else None)
    return data


def _result(
    entities: list[dict], classifications: list[dict], relations: list[dict] | None = None, data: dict | None = None
) -> dict[str, Any]:
    return {"entities": entities, "relations": relations or [], "classifications": classifications, "objects": [],
            "data": data or {}}  # fmt: skip
