"""Zero-shot relation extraction with GLiREL: each item names its entities (`metadata.entities`, character offsets);
the request's labels are relation types. The text is split into words as glirel splits them, prefixed with the
relation-type prompt (`[REL] type … [SEP]`) and encoded word by word; the converted graph
(`sie.worker.convert.glirel`) scores every ordered pair of entities against every type, and the pairs above the
threshold come back as `relations` (head, tail, relation, score), best first, at most `top_k` types per pair, as
`GLiREL.predict_relations` returns them; the entities come back as they were sent.

GLiREL reads the first `max_len` words of a text (and no more than the model's tokens hold beside the prompt):
entities past them take no part, as when glirel truncates the text itself. Relations need both entities in one
reading, so a long text is not read in windows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Final

import attrs
import numpy as np

from sie.catalog.adapters import GLIREL
from sie.catalog.options import entities_problem
from sie.tokenization import TokenizedWords, pad_batch
from sie.worker.adapters.base import Adapter, AdapterContext, BatchResult, ItemResult, Stopwatch, invalid
from sie.worker.adapters.encoder import item_text
from sie.worker.adapters.zero_shot import marked_prompt, prompts_by_label_set, split_requests, zero_shot_refusal
from sie.worker.convert.names import (
    ENTITY_PAIRS,
    ENTITY_SPANS,
    GLIREL_CONFIG_FILE,
    LABEL_POSITIONS,
    RELATION_SCORES,
    WORD_COUNTS,
    WORD_POSITIONS,
)
from sie.worker.spans import Word, split_words

DEFAULT_THRESHOLD: Final = 0.3  # the public adapter's; a YAML's runtime options may set another
DEFAULT_TOP_K: Final = 10
# The tokens glirel adds to its backbone's tokenizer when it loads (a GLiREL checkpoint saves none of its own).
ADDED_SPECIAL_TOKENS: Final = ("[FLERT]",)
ADDED_TOKENS: Final = ("[REL]", "[SEP]", "[E]", "[/E]")
# Pairs one graph run holds (each costing `GlirelAdapter._pair_cost` units: 256 entities make 65,280 pairs, whose
# projections alone would take gigabytes at a large model's width): more run in several, a row's pairs split
# across runs (its text read again in each), so memory stays bounded whatever the entities.
PAIR_BUDGET: Final = 8192


@attrs.frozen
class GlirelSettings:
    """What the adapter reads of `glirel_config.json`."""

    max_len: int = 384
    label_strategy: str = "ent_token"
    max_pair_distance: int | None = None
    scorer: str = "dot"
    rel_token: str = "[REL]"
    sep_token: str = "[SEP]"

    @classmethod
    def read(cls, context: AdapterContext) -> GlirelSettings:
        path = context.model_dir / GLIREL_CONFIG_FILE if context.model_dir is not None else None
        if path is None or not path.is_file():
            raise ValueError(f"no {GLIREL_CONFIG_FILE} beside the model")
        raw = json.loads(path.read_text(encoding="utf-8"))
        distance = raw.get("max_entity_pair_distance")
        return cls(int(raw.get("max_len") or 384), str(raw.get("label_embed_strategy", "ent_token")),
                   int(distance) if distance is not None else None, str(raw.get("scorer", "dot")))  # fmt: skip


@attrs.frozen
class Entity:
    """One entity an item names: its character span, and the words it covers (first and last, inclusive)."""

    start: int
    end: int
    first_word: int
    last_word: int


def locate(entities: list[dict[str, Any]], words: Sequence[Word], read_end: int, text: str) -> list[Entity | None]:
    """Each entity's words among `words` (those read, up to character `read_end`), or None for one that reaches
    past them (anything but spaces after `read_end`), as the public adapter leaves such entities out."""
    located: list[Entity | None] = []
    for entity in entities:
        start, end = entity["start"], entity["end"]
        read = end <= read_end or (start < read_end and not text[read_end:end].strip())
        covered = [index for index, word in enumerate(words) if word.end > start and word.start < end] if read else []
        located.append(Entity(start, end, covered[0], covered[-1]) if covered else None)
    return located


def entity_pairs(spans: Sequence[tuple[int, int]], max_distance: int | None) -> list[tuple[int, int]]:
    """The (head, tail) entity pairs glirel scores, in its order: every i < j, and every i > j whose starts are at
    most `max_distance` words apart (all of them when None)."""
    pairs = []
    for head, (head_start, _) in enumerate(spans):
        for tail, (tail_start, _) in enumerate(spans):
            near = max_distance is None or abs(head_start - tail_start) <= max_distance
            if head < tail or (head != tail and near):
                pairs.append((head, tail))
    return pairs


@attrs.frozen
class _Row:
    """One item read: its prompt and words encoded, where its types and words sit, its entities and pairs."""

    item: int
    tokens: TokenizedWords
    word_positions: list[int]
    label_positions: list[list[int]]
    spans: list[tuple[int, int]]  # each read entity's first and last word
    span_owner: list[int]  # the index in metadata.entities of each read entity
    pairs: list[tuple[int, int]]


@attrs.frozen
class _Request:
    text: str
    entities: list[dict[str, Any]]
    labels: list[str]
    threshold: float
    top_k: int


class GlirelAdapter(Adapter):
    """`sie.adapters.glirel`: extract only; relation types come with each request, entities with each item."""

    kind: ClassVar[str | None] = GLIREL
    supports_extract: ClassVar[bool] = True

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        self.settings = GlirelSettings.read(context)
        self.tokenizer = context.tokenizer.with_added_tokens(ADDED_SPECIAL_TOKENS, ADDED_TOKENS)

    def extract(self, items: Sequence[Any]) -> BatchResult:
        watch = Stopwatch()
        results, requests = split_requests(items, self._request)
        if requests:
            with watch.stage("tokenization"):
                rows = self._rows(requests, results)
            scores: dict[int, np.ndarray] = {}
            with watch.stage("inference"):
                for run in pair_runs(rows, self._pair_cost, PAIR_BUDGET):
                    for row, part in zip(run, self._scores(run), strict=True):
                        kept = part[: len(row.pairs), : len(row.label_positions)]
                        scores[row.item] = np.concatenate([scores[row.item], kept]) if row.item in scores else kept
            with watch.stage("postprocessing"):
                for row in rows:
                    results[row.item] = self._answer(requests[row.item], row, scores.get(row.item))
        return watch.finish(results)

    def _request(self, item: Any) -> _Request | ItemResult:
        refused = zero_shot_refusal(self, item)
        if refused is not None:
            return refused
        text = item_text(item.item) or ""
        metadata = (item.item or {}).get("metadata")
        entities = metadata.get("entities") if isinstance(metadata, dict) else None
        problem = entities_problem(text, entities)
        if problem is not None:
            return invalid(problem)
        options = self.options_for(item.options)
        return _Request(
            text=text,
            entities=entities,
            labels=list(dict.fromkeys(item.labels)),  # glirel reads a repeated relation type once
            threshold=float(options.get("threshold", DEFAULT_THRESHOLD)),
            top_k=int(options.get("top_k") or DEFAULT_TOP_K),
        )

    def _prompt(self, labels: list[str]) -> list[str]:
        return marked_prompt(labels, self.settings.rel_token, self.settings.sep_token)

    def _rows(self, requests: dict[int, _Request], results: list[ItemResult]) -> list[_Row]:
        """Each item's prompt and the words of its text that fit, encoded; an item whose relation types leave no
        room for its text gets its error instead."""
        prompts = prompts_by_label_set(self.tokenizer, [tuple(r.labels) for r in requests.values()],
                                       lambda labels: self._prompt(list(labels)))  # fmt: skip
        all_words = {index: split_words(request.text) for index, request in requests.items()}
        counts = self.tokenizer.word_token_counts(
            [[word.text for word in words[: self.settings.max_len]] for words in all_words.values()]
        )
        planned: list[tuple[int, list[str], list[Word]]] = []
        for (index, request), word_counts in zip(requests.items(), counts, strict=True):
            prompt = prompts[tuple(request.labels)]
            refused = prompt.refusal(len(request.labels), "relation types")
            if refused is not None:
                results[index] = refused
                continue
            fits = int(np.searchsorted(np.cumsum(word_counts), prompt.room, side="right"))
            planned.append((index, prompt.words, all_words[index][:fits]))
        encoded = self.tokenizer.encode_words([prompt + [word.text for word in words] for _, prompt, words in planned])
        rows = []
        for (index, prompt, words), tokens in zip(planned, encoded, strict=True):
            first = tokens.first_tokens()
            markers = range(0, len(prompt) - 1, 2)
            label_positions = [self._label_tokens(first, marker) for marker in markers]
            word_positions = [first.get(len(prompt) + offset, 0) for offset in range(len(words))]
            text = requests[index].text
            whole = len(words) == len(all_words[index])
            read_end = len(text) if whole else (words[-1].end if words else 0)
            located = locate(requests[index].entities, words, read_end, text)
            owners = [number for number, entity in enumerate(located) if entity is not None]
            spans = [(located[number].first_word, located[number].last_word) for number in owners]  # type: ignore[union-attr]
            pairs = entity_pairs(spans, self.settings.max_pair_distance)
            rows.append(_Row(index, tokens, word_positions, label_positions, spans, owners, pairs))
        return rows

    def _label_tokens(self, first: dict[int, int], marker: int) -> list[int]:
        """The token positions a relation type's representation averages: its `[REL]` marker, its own first token,
        or both (`label_embed_strategy`)."""
        strategy = self.settings.label_strategy
        if strategy == "label":
            return [first.get(marker + 1, 0)]
        if strategy == "both":
            return [first.get(marker, 0), first.get(marker + 1, 0)]
        return [first.get(marker, 0)]

    def _pair_cost(self, row: _Row) -> int:
        """What one pair of `row` holds in the graph, in PAIR_BUDGET's units: its projection, and with the
        concatenating scorer a feature vector for each relation type too."""
        return 1 + (len(row.label_positions) if self.settings.scorer == "concat_proj" else 0)

    def _scores(self, rows: list[_Row]) -> np.ndarray:
        batch = pad_batch([row.tokens.input_ids for row in rows], None, self.tokenizer.pad_id)
        feeds = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "token_type_ids": batch.token_type_ids,
            WORD_POSITIONS: _padded([row.word_positions for row in rows]),
            WORD_COUNTS: np.array([len(row.word_positions) for row in rows], dtype=np.int64),
            LABEL_POSITIONS: _padded([row.label_positions for row in rows]),
            ENTITY_SPANS: _padded([row.spans for row in rows]),
            ENTITY_PAIRS: _padded([row.pairs for row in rows]),
        }
        (scores,) = self.run_session(feeds, [RELATION_SCORES])
        return scores.astype(np.float32, copy=False)

    def _answer(self, request: _Request, row: _Row, scores: np.ndarray | None) -> ItemResult:
        found: list[tuple[float, int, int]] = []  # (score, pair, relation type), glirel's order: pair, then type
        if scores is not None:
            valid = scores[: len(row.pairs), : len(request.labels)]
            for pair, label in zip(*np.nonzero(valid > request.threshold), strict=True):
                found.append((float(valid[pair, label]), int(pair), int(label)))
        found.sort(key=lambda hit: -hit[0])  # stable: ties stay in glirel's order
        per_pair: dict[tuple[tuple[int, int], tuple[int, int]], int] = {}
        relations = []
        for score, pair, label in found:
            head, tail = row.pairs[pair]
            where = (row.spans[head], row.spans[tail])
            if per_pair.get(where, 0) >= request.top_k:
                continue
            per_pair[where] = per_pair.get(where, 0) + 1
            relations.append({
                "head": self._entity_text(request, row, head), "tail": self._entity_text(request, row, tail),
                "relation": request.labels[label], "score": score,
            })  # fmt: skip
        entities = [
            {"text": entity.get("text", ""), "label": entity.get("label", ""), "score": entity.get("score", 1.0),
             "start": entity["start"], "end": entity["end"], "bbox": None}
            for entity in request.entities
        ]  # fmt: skip
        result = {"entities": entities, "relations": relations, "classifications": [], "objects": [], "data": {}}
        return ItemResult(result, input_tokens=len(row.tokens))

    @staticmethod
    def _entity_text(request: _Request, row: _Row, entity: int) -> str:
        """The text of the first entity the caller named at this one's words: its own `text` where it sent one, else
        the characters it spans."""
        span = row.spans[entity]
        named = request.entities[row.span_owner[row.spans.index(span)]]
        text = named.get("text")
        return (text if isinstance(text, str) and text else request.text[named["start"] : named["end"]]).strip()


def pair_runs(rows: Sequence[_Row], cost: Callable[[_Row], int], budget: int) -> list[list[_Row]]:
    """The graph runs that score `rows`' pairs: each row with pairs cut into parts of at most `budget` units (its
    pairs in order, each part the row with a slice of them), parts gathered in order into runs of at most `budget`
    units (a part alone may fill one)."""
    runs: list[list[_Row]] = []
    current: list[_Row] = []
    used = 0
    for row in rows:
        unit = cost(row)
        step = max(1, budget // unit)
        for start in range(0, len(row.pairs), step):
            part = attrs.evolve(row, pairs=row.pairs[start : start + step])
            size = len(part.pairs) * unit
            if current and used + size > budget:
                runs.append(current)
                current, used = [], 0
            current.append(part)
            used += size
    if current:
        runs.append(current)
    return runs


def _padded(rows: list[list[Any]]) -> np.ndarray:
    """Right-padded int64 [rows, longest, ...] of nested lists (zeros past each row's end)."""
    longest = max((len(row) for row in rows), default=0)
    inner = next((np.asarray(row[0]).shape for row in rows if row), ())
    out = np.zeros((len(rows), max(longest, 1), *inner), dtype=np.int64)
    for number, row in enumerate(rows):
        if row:
            out[number, : len(row)] = np.asarray(row, dtype=np.int64)
    return out
