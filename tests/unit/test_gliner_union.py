"""The GLiNER union's composition rules (word windows, the union of spans, propagated names) and its options, as pure
functions; served against the gliner package in tests/integration/test_gliner_union.py."""

from __future__ import annotations

import pytest

from sie.catalog.adapters import GLINER_UNION, adapter_kind
from sie.catalog.options import labels_problem, option_problem
from sie.wire.queue import OPERATION_EXTRACT
from sie.worker.adapters.gliner_union import Composition, Span, compose, propagate_names, union_spans, word_windows


def test_a_short_text_is_one_window_and_a_long_one_shares_words() -> None:
    assert word_windows("a b c", 3, 1) == [(0, 5)]
    text = "w0 w1 w2 w3 w4 w5 w6"
    windows = word_windows(text, 3, 1)
    assert [text[start:end] for start, end in windows] == ["w0 w1 w2", "w2 w3 w4", "w4 w5 w6"]
    # The last window ends at the last word, however few words it has left.
    assert [text[s:e] for s, e in word_windows(text, 4, 1)] == ["w0 w1 w2 w3", "w3 w4 w5 w6"]
    # GLiNER's words: runs of word characters (joined by - or _), or one other character.
    other = "e-mail me, now!"
    assert [other[s:e] for s, e in word_windows(other, 2, 0)] == ["e-mail me", ", now", "!"]


def test_the_union_keeps_one_span_per_extent_and_label_at_its_best_score() -> None:
    first = [Span(0, 4, "person", 0.7), Span(5, 9, "city", 0.4)]
    second = [Span(0, 4, "person", 0.9), Span(0, 4, "city", 0.6), Span(2, 9, "person", 0.65)]
    assert union_spans([first, second], 0.5) == [
        Span(0, 4, "person", 0.9), Span(0, 4, "city", 0.6), Span(2, 9, "person", 0.65)
    ]  # fmt: skip
    assert union_spans([first, second], 0.95) == []


def test_names_recur_as_whole_case_sensitive_words_outside_spans() -> None:
    text = "Ann Lee met Lee. Leeds is not Lee; lee neither. Ann-Lee and Ann."
    spans = [Span(0, 7, "person", 0.8), Span(17, 22, "city", 0.9)]
    added = propagate_names(text, spans, "person", 3)
    # "Ann" and "Lee" (three letters each), not "Leeds", "lee" nor the ones inside the first span.
    assert [(text[s.start : s.end], s.start) for s in added] == [
        ("Ann", 48), ("Ann", 60), ("Lee", 12), ("Lee", 30), ("Lee", 52),
    ]  # fmt: skip
    assert all(s.label == "person" and s.score == 0.8 for s in added)
    assert propagate_names(text, spans, "person", 4) == []
    spans_in_order = compose(text, [spans], Composition(score_floor=0.5, propagate_label="person"))
    assert [s.start for s in spans_in_order] == sorted(s.start for s in spans_in_order)


def test_composition_options_are_checked_together() -> None:
    assert Composition.read({"window_words": 20, "window_overlap": 5, "propagate_label": ""}) == Composition(
        window_words=20, window_overlap=5, propagate_label=None
    )
    with pytest.raises(ValueError, match="'window_overlap' \\(50\\) must be less than 'window_words' \\(40\\)"):
        Composition.read({"window_words": 40})
    with pytest.raises(ValueError, match="Option 'name_min_letters' must be a whole number of letters"):
        Composition.read({"name_min_letters": 0})


def test_the_public_module_routes_to_the_union_and_its_options_are_checked() -> None:
    assert adapter_kind("sie_server.adapters.gliner_union.adapter:GLiNERUnionAdapter") == GLINER_UNION
    assert option_problem({"score_floor": 0.6, "window_words": 300}, GLINER_UNION, OPERATION_EXTRACT) is None
    assert "does not apply" in option_problem({"flat_ner": True}, GLINER_UNION, OPERATION_EXTRACT)
    assert "non-empty list" in option_problem({"default_labels": []}, GLINER_UNION, OPERATION_EXTRACT)
    # Labels may be left out (the model's default labels stand in); the request's default labels count as labels.
    assert labels_problem(None, GLINER_UNION, 10) is None
    assert "has 11 labels" in labels_problem([], GLINER_UNION, 10, {"default_labels": ["x"] * 11})
