"""Relations between the entities a GLiNER relation-extraction model finds ("relex", `gliner_uni_encoder_span_relex`),
as `gliner` finds them: in each row (a window of a text) every span scored above the entity threshold for some label
is a candidate, in span order; the relation graph (`sie.worker.convert.gliner_relations`) keeps the ordered pairs of
candidates its adjacency puts above the row's adjacency threshold and scores them against the row's relation types;
a pair's relation is kept above the relation threshold when both its entities are among those the row's decoding
kept. The candidates are capped per row (MAX_CANDIDATES, in span order) and the rows of one graph run bounded by the
pairs they can make (PAIR_BUDGET) and the pair-type scores the graph holds (SCORE_BUDGET), so memory stays bounded
whatever the threshold and the relation types.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import attrs
import numpy as np

from sie.worker.convert.names import (
    ADJACENCY_THRESHOLDS,
    ENTITY_MASK,
    ENTITY_SPANS,
    PAIR_INDEX,
    RELATION_EMBEDDINGS,
    RELATION_SCORES,
    WORD_EMBEDDINGS,
)
from sie.worker.spans import Span, candidate_spans

# Candidates one row's relations are read between (the first, in span order): 100 make 9,900 ordered pairs.
MAX_CANDIDATES: Final = 100
# One relation-graph run's rows x the most candidates' square (the pairs its adjacency tensors hold, padding
# included, and the most it may keep), and its pairs x rows x the most relation types (the scores it holds before
# each pair's own row's are taken). A row over either runs alone: 100 candidates make 9,900 pairs, whose [pairs,
# 4 x width] projection is the largest tensor (160 MB at a large model's 1,024).
PAIR_BUDGET: Final = 8192
SCORE_BUDGET: Final = 1 << 22
# The adjacency threshold is the entity threshold, never below this (the public server's floor).
ADJACENCY_FLOOR: Final = 0.5


@attrs.frozen
class RowRelations:
    """What one row asks of the relation graph: its words' and relation types' embeddings (from the span graph),
    its entity candidates and thresholds."""

    words: np.ndarray  # [words, width]
    types: np.ndarray  # [types, width]
    candidates: list[Span]
    type_count: int
    entity_threshold: float
    relation_threshold: float


@attrs.frozen
class Relation:
    """A relation found in one row: head and tail as word spans of the row [start, end], the type's index."""

    head: tuple[int, int]
    tail: tuple[int, int]
    type: int
    score: float


def relation_candidates(scores: np.ndarray, words: int, labels: int, threshold: float, max_width: int) -> list[Span]:
    """One row's candidates from its span scores [words, widths, labels]: every span whose best label scores above
    `threshold`, in span order (start word, then width), the first MAX_CANDIDATES."""
    return candidate_spans(scores, words, labels, threshold, max_width, multi_label=False)[:MAX_CANDIDATES]


class RelationScorer:
    """A relex model's relation graph, run over the rows that have two candidates or more."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def relations(self, rows: Sequence[RowRelations]) -> list[list[Relation]]:
        """Each row's relations, in gliner's order (pair by pair, head by head, then by type)."""
        found: list[list[Relation]] = [[] for _ in rows]
        scored = [number for number, row in enumerate(rows) if len(row.candidates) >= 2]
        for run in _runs(scored, rows):
            self._run([rows[number] for number in run], [found[number] for number in run])
        return found

    def _run(self, rows: list[RowRelations], found: list[list[Relation]]) -> None:
        entities = max(len(row.candidates) for row in rows)
        words = max(row.words.shape[0] for row in rows)
        types = max(row.types.shape[0] for row in rows)
        width = rows[0].words.shape[1]
        feeds = {
            WORD_EMBEDDINGS: np.zeros((len(rows), words, width), dtype=np.float32),
            ENTITY_SPANS: np.zeros((len(rows), entities, 2), dtype=np.int64),
            ENTITY_MASK: np.zeros((len(rows), entities), dtype=np.float32),
            RELATION_EMBEDDINGS: np.zeros((len(rows), types, width), dtype=np.float32),
            ADJACENCY_THRESHOLDS: np.array(
                [max(row.entity_threshold, ADJACENCY_FLOOR) for row in rows], dtype=np.float32
            ),
        }
        for number, row in enumerate(rows):
            feeds[WORD_EMBEDDINGS][number, : row.words.shape[0]] = row.words
            feeds[RELATION_EMBEDDINGS][number, : row.types.shape[0]] = row.types
            feeds[ENTITY_SPANS][number, : len(row.candidates)] = [(span.start, span.end) for span in row.candidates]
            feeds[ENTITY_MASK][number, : len(row.candidates)] = 1.0
        pairs, scores = self._session.run([PAIR_INDEX, RELATION_SCORES], feeds)
        for (number, head, tail), pair_scores in zip(pairs.tolist(), scores, strict=True):
            row = rows[number]
            first, second = row.candidates[head], row.candidates[tail]
            valid = pair_scores[: row.type_count]
            for kind in np.nonzero(valid > np.float32(row.relation_threshold))[0].tolist():
                found[number].append(Relation((first.start, first.end), (second.start, second.end), kind,
                                              float(valid[kind])))  # fmt: skip


def _runs(numbers: list[int], rows: Sequence[RowRelations]) -> list[list[int]]:
    """The rows `numbers` in runs within PAIR_BUDGET and SCORE_BUDGET (a row alone may pass them), fewest candidates
    first so rows of a run pad little."""
    runs: list[list[int]] = []
    for number in sorted(numbers, key=lambda one: len(rows[one].candidates)):
        grown = [*runs[-1], number] if runs else [number]
        if runs and _within_budgets([rows[one] for one in grown]):
            runs[-1] = grown
        else:
            runs.append([number])
    return runs


def _within_budgets(rows: list[RowRelations]) -> bool:
    square = max(len(row.candidates) for row in rows) ** 2
    pairs = len(rows) * square
    return pairs <= PAIR_BUDGET and pairs * len(rows) * max(row.type_count for row in rows) <= SCORE_BUDGET
