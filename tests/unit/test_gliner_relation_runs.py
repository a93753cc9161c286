"""How a GLiNER relation model's rows are put to its relation graph (`sie.worker.adapters.gliner_relations`): rows of
fewer than two candidates never, the others once each, in runs whose padded pairs and pair-type scores stay within
the budgets (a row over them alone). The session is a recorder: the plan is the subject here; the graph's results are
checked against gliner in tests/integration/test_gliner_relex.py."""

from __future__ import annotations

from typing import Any

import numpy as np

from sie.worker.adapters.gliner_relations import PAIR_BUDGET, SCORE_BUDGET, RelationScorer, RowRelations
from sie.worker.convert.names import ENTITY_MASK, ENTITY_SPANS, RELATION_EMBEDDINGS, WORD_EMBEDDINGS
from sie.worker.spans import Span


class RecordingSession:
    def __init__(self) -> None:
        self.runs: list[dict[str, np.ndarray]] = []

    def run(self, outputs: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        self.runs.append(feeds)
        return [np.zeros((0, 3), dtype=np.int64), np.zeros((0, feeds[RELATION_EMBEDDINGS].shape[1]), np.float32)]


def row(candidates: int, types: int, words: int = 120) -> RowRelations:
    spans = [Span(index, index, 0, 0.9) for index in range(candidates)]
    return RowRelations(np.zeros((words, 8), np.float32), np.ones((types, 8), np.float32), spans, types, 0.5, 0.5)


def test_rows_run_once_each_within_the_budgets() -> None:
    rows: list[Any] = [row(3, 2) for _ in range(300)] + [row(100, 100), row(1, 5), row(40, 100), row(7, 30)]
    session = RecordingSession()
    found = RelationScorer(session).relations(rows)
    assert len(found) == len(rows)
    fed = sum(int(feeds[ENTITY_MASK].sum()) for feeds in session.runs)
    assert fed == sum(len(one.candidates) for one in rows if len(one.candidates) >= 2)  # each once, the 1 never
    assert len(session.runs) < 300 / 2, "small rows share runs"
    for feeds in session.runs:
        count, entities, _ = feeds[ENTITY_SPANS].shape
        pairs = count * entities**2
        scores = pairs * count * feeds[RELATION_EMBEDDINGS].shape[1]
        assert count == 1 or (pairs <= PAIR_BUDGET and scores <= SCORE_BUDGET)
        assert feeds[WORD_EMBEDDINGS].shape[0] == count
    assert any(feeds[ENTITY_SPANS].shape[:2] == (1, 100) for feeds in session.runs), "the largest row runs alone"
