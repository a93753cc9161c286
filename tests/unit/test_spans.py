"""Word spans of zero-shot extraction: gliner's word splitter, windows over long texts (bounded in words and tokens,
each word owned by one window away from the edges), span candidates in gliner's order, its greedy overlap
resolution (flat, nested, several labels per span) and the merging of adjacent spans."""

from __future__ import annotations

import numpy as np
import pytest

from sie.worker.spans import (
    VECTORISED_CHECK,
    Span,
    _conflict,
    candidate_spans,
    merge_adjacent,
    plan_windows,
    resolve_overlaps,
    split_words,
    token_spans,
)


def test_words_split_as_gliner_splits_them() -> None:
    text = "Jean-Luc's e-mail: jl_p@x.org, 3.5 km!"
    words = split_words(text)
    assert [w.text for w in words] == ["Jean-Luc", "'", "s", "e-mail", ":", "jl_p", "@", "x", ".", "org", ",", "3",
                                       ".", "5", "km", "!"]  # fmt: skip
    assert all(text[w.start : w.end] == w.text for w in words)
    assert split_words("   ") == []


def test_one_window_when_the_text_fits() -> None:
    (window,) = plan_windows(np.ones(10, dtype=np.int64), max_words=10, max_tokens=10, overlap=4)
    assert (window.start, window.stop, window.own_start, window.own_stop) == (0, 10, 0, 10)


SHAPES = [(100, 30, 1000, 8), (57, 64, 40, 10), (200, 64, 64, 24), (33, 5, 100, 4)]


@pytest.mark.parametrize(("words", "max_words", "max_tokens", "overlap"), SHAPES)
def test_windows_cover_every_word_once_within_their_bounds(
    words: int, max_words: int, max_tokens: int, overlap: int
) -> None:
    counts = np.random.default_rng(words).integers(1, 3, words)
    windows = plan_windows(counts, max_words, max_tokens, overlap)
    assert windows[0].start == 0 and windows[-1].stop == words
    owned = [word for window in windows for word in range(window.own_start, window.own_stop)]
    assert owned == list(range(words))  # each word owned once, in order
    for before, after in zip(windows, windows[1:], strict=False):
        assert after.start > before.start and after.start <= before.stop
        assert before.stop - after.start == min(overlap, before.stop - before.start - 1)
    for window in windows:
        assert window.stop - window.start <= max_words
        assert counts[window.start : window.stop].sum() <= max_tokens
        assert window.start <= window.own_start and window.own_stop <= window.stop
        # a span owned by a window and up to overlap/2 words long ends inside it
        assert window.own_stop == words or window.own_stop + overlap // 2 <= window.stop


def test_a_word_longer_than_the_token_budget_gets_a_window_of_its_own() -> None:
    windows = plan_windows(np.array([1, 50, 1]), max_words=10, max_tokens=8, overlap=2)
    assert [(w.start, w.stop) for w in windows] == [(0, 1), (1, 2), (2, 3)]


def test_candidates_in_gliner_order_above_the_threshold_only() -> None:
    scores = np.zeros((4, 3, 2), dtype=np.float32)
    scores[0, 1, 1] = 0.9  # words 0-1, label 1
    scores[2, 0, 0] = 0.6
    scores[3, 1, 0] = 0.99  # past the last word: never a candidate
    scores[1, 0, 1] = 0.5  # at the threshold: not above it
    scores[0, 0, 2 - 1] = 0.7
    found = candidate_spans(scores, words=4, labels=2, threshold=0.5, max_width=3)
    assert found == [Span(0, 0, 1, pytest.approx(0.7)), Span(0, 1, 1, pytest.approx(0.9)), Span(2, 2, 0,
                     pytest.approx(0.6))]  # fmt: skip
    assert candidate_spans(scores, words=4, labels=1, threshold=0.5, max_width=3) == [Span(2, 2, 0, pytest.approx(0.6))]
    assert candidate_spans(scores, words=4, labels=2, threshold=0.5, max_width=1) == [
        Span(0, 0, 1, pytest.approx(0.7)),
        Span(2, 2, 0, pytest.approx(0.6)),
    ]


def test_overlaps_resolve_highest_score_first() -> None:
    spans = [Span(0, 2, 0, 0.9), Span(1, 1, 0, 0.8), Span(0, 2, 1, 0.7), Span(2, 3, 1, 0.6), Span(5, 5, 0, 0.5)]
    assert resolve_overlaps(spans, flat=True, multi_label=False, max_width=4) == [spans[0], spans[4]]
    assert resolve_overlaps(spans, flat=True, multi_label=True, max_width=4) == [spans[0], spans[2], spans[4]]
    # nested: a span inside a kept one stays, one crossing it does not
    assert resolve_overlaps(spans, flat=False, multi_label=False, max_width=4) == [spans[0], spans[1], spans[4]]
    assert resolve_overlaps(spans, flat=False, multi_label=True, max_width=4) == [spans[0], spans[2], spans[1],
                                                                                  spans[4]]  # fmt: skip
    ties = [Span(3, 3, 0, 0.5), Span(3, 4, 0, 0.5)]
    assert resolve_overlaps(ties, flat=True, multi_label=False, max_width=4) == [ties[0]]


def test_adjacent_spans_of_one_label_merge() -> None:
    text = "New York City is big"
    entities = [{"text": "York", "label": "city", "score": 0.6, "start": 4, "end": 8},
                {"text": "New", "label": "city", "score": 0.4, "start": 0, "end": 3},
                {"text": "City", "label": "city", "score": 0.5, "start": 9, "end": 13},
                {"text": "big", "label": "size", "score": 0.9, "start": 17, "end": 20}]  # fmt: skip
    merged = merge_adjacent(entities, text)
    assert [(e["text"], e["start"], e["end"], e["score"]) for e in merged] == [("New York City", 0, 13, 0.6),
                                                                               ("big", 17, 20, 0.9)]  # fmt: skip


def test_token_level_spans_pair_starts_and_ends_through_inside_words() -> None:
    scores = np.zeros((5, 2, 3), dtype=np.float32)  # words, labels, (start, end, inside)
    scores[1, 0] = (0.9, 0.2, 0.8)  # starts label 0 at word 1
    scores[2, 0] = (0.1, 0.3, 0.7)
    scores[3, 0] = (0.1, 0.6, 0.9)  # ends it at word 3: words 1-3, scored by the least (end 0.6)
    scores[4, 0] = (0.1, 0.95, 0.2)  # an end past an inside below the threshold: no span
    scores[0, 1] = (0.7, 0.7, 0.7)  # label 1: one word on its own
    assert token_spans(scores, words=5, labels=2, threshold=0.5, max_width=10) == [
        Span(0, 0, 1, pytest.approx(0.7)),
        Span(1, 3, 0, pytest.approx(0.6)),
    ]
    assert token_spans(scores, words=5, labels=2, threshold=0.5, max_width=2) == [Span(0, 0, 1, pytest.approx(0.7))]
    assert token_spans(scores, words=5, labels=1, threshold=0.5, max_width=10) == [Span(1, 3, 0, pytest.approx(0.6))]


@pytest.mark.parametrize(("flat", "multi_label"), [(True, False), (False, False), (False, True), (True, True)])
def test_many_near_kept_spans_resolve_as_one_by_one(flat: bool, multi_label: bool) -> None:
    """Wide spans near many kept ones (a token-level model's) are checked against them in one vectorised check: the
    same spans are kept as when each is checked on its own, as gliner's greedy search checks them."""
    rng = np.random.default_rng(3)
    widest = 4 if flat else 40  # flat: narrow spans, so more than VECTORISED_CHECK of them are kept
    spans = [Span(int(start), int(start + rng.integers(0, widest)), int(rng.integers(0, 3)), float(rng.random()))
             for start in rng.integers(0, 400, 3000)]  # fmt: skip
    one_by_one: list[Span] = []
    for span in sorted(spans, key=lambda one: -one.score):
        if not any(_conflict(span, other, flat, multi_label) for other in one_by_one):
            one_by_one.append(span)
    kept = resolve_overlaps(spans, flat, multi_label, max_width=60)
    assert kept == sorted(one_by_one, key=lambda one: one.start)
    assert len(kept) > VECTORISED_CHECK, "the vectorised check must be reached"
