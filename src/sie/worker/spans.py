"""Word spans of zero-shot extraction (GLiNER): splitting a text into words with their character offsets, cutting a
long text into overlapping windows of words, picking spans from a window's scores and resolving overlaps as the
`gliner` package does (highest score first; a span kept unless it overlaps one already kept — or, for nested
extraction, crosses one without either holding the other), and merging adjacent spans of one label. Pure numpy and
Python: the adapter feeds it scores and words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs
import numpy as np

# gliner's `whitespace` word splitter: runs of word characters (joined by - or _), or any other single character.
WORD_PATTERN = re.compile(r"\w+(?:[-_]\w+)*|\S")


@attrs.frozen
class Word:
    text: str
    start: int  # character offsets in the text
    end: int


def split_words(text: str) -> list[Word]:
    return [Word(match.group(), match.start(), match.end()) for match in WORD_PATTERN.finditer(text)]


@attrs.frozen
class Window:
    """Words [start, stop) of a text read as one row; spans starting in [own_start, own_stop) are taken from this
    window (each word is owned by exactly one window, away from the edges where context is cut)."""

    start: int
    stop: int
    own_start: int
    own_stop: int


def plan_windows(token_counts: np.ndarray, max_words: int, max_tokens: int, overlap: int) -> list[Window]:
    """Windows over a text's words (`token_counts` tokens each) of at most `max_words` words and `max_tokens` tokens
    (a window holds at least one word, whatever it takes); consecutive windows share `overlap` words where they can,
    and each owns the words up to the middle of what it shares with the next."""
    total = len(token_counts)
    if total == 0:
        return [Window(0, 0, 0, 0)]
    bounds: list[tuple[int, int]] = []
    start = 0
    while True:
        stop, used = start, 0
        while stop < total and stop - start < max_words and (stop == start or used + token_counts[stop] <= max_tokens):
            used += int(token_counts[stop])
            stop += 1
        bounds.append((start, stop))
        if stop >= total:
            break
        start = max(start + 1, stop - overlap)
    windows = []
    own_start = 0
    for index, (start, stop) in enumerate(bounds):
        own_stop = total if index + 1 == len(bounds) else max(own_start, (bounds[index + 1][0] + stop) // 2)
        windows.append(Window(start, stop, own_start, own_stop))
        own_start = own_stop
    return windows


@attrs.frozen
class Span:
    """A span of words [start, end] (inclusive, as gliner counts) with one label's index and score."""

    start: int
    end: int
    label: int
    score: float


def candidate_spans(  # noqa: PLR0913 - one row's scores and what bounds them
    scores: np.ndarray, words: int, labels: int, threshold: float, max_width: int, multi_label: bool = True
) -> list[Span]:
    """The spans of one row's scores [words, widths, labels] above `threshold` (strictly, as gliner compares), in
    gliner's order (by start word, width, then label); spans past the row's `words`, padded labels and widths from
    `max_width` on are not candidates. Without `multi_label` only each span's best label is (the first of equal
    ones): `resolve_overlaps` would drop the others whatever else it keeps, as they cover the same words."""
    widths = min(scores.shape[1], max_width)
    scores = scores[:words, :widths, :labels]
    valid = np.arange(words)[:, None] + np.arange(widths)[None, :] < words
    if multi_label:
        starts, steps, classes = np.nonzero((scores > np.float32(threshold)) & valid[:, :, None])
        values = scores[starts, steps, classes].tolist()
    else:
        best = scores.argmax(axis=2)
        top = np.take_along_axis(scores, best[:, :, None], axis=2)[:, :, 0]
        starts, steps = np.nonzero((top > np.float32(threshold)) & valid)
        classes, values = best[starts, steps], top[starts, steps].tolist()
    return [
        Span(start, start + step, label, value)
        for start, step, label, value in zip(starts.tolist(), steps.tolist(), classes.tolist(), values, strict=True)
    ]


def token_spans(scores: np.ndarray, words: int, labels: int, threshold: float, max_width: int) -> list[Span]:
    """A token-level model's spans from one row's start, end and inside scores [words, labels, 3], as gliner's
    TokenDecoder finds them: every start above `threshold` paired with every end above it of the same label at or
    after it (and less than `max_width` words on), kept when no word between them is inside below `threshold`,
    scored by the least of its start, end and inside scores; in gliner's order (starts by word then label, each with
    its ends in that order)."""
    scores = scores[:words, :labels]
    start, end, inside = scores[:, :, 0], scores[:, :, 1], scores[:, :, 2]
    bar = np.float32(threshold)
    starts = list(zip(*(axis.tolist() for axis in np.nonzero(start > bar)), strict=True))
    ends = list(zip(*(axis.tolist() for axis in np.nonzero(end > bar)), strict=True))
    found = []
    for first, label in starts:
        for last, end_label in ends:
            if last < first or end_label != label or last - first >= max_width:
                continue
            between = inside[first : last + 1, label]
            if (between < bar).any():
                continue
            score = min(float(between.min()), float(start[first, label]), float(end[last, label]))
            found.append(Span(first, last, label, score))
    return found


# Kept spans a span is checked against one by one; past this, in one vectorised check.
VECTORISED_CHECK = 48


def resolve_overlaps(spans: Sequence[Span], flat: bool, multi_label: bool, max_width: int) -> list[Span]:
    """gliner's greedy search: spans by descending score (ties in the order given), each kept unless it conflicts
    with one kept before; returned by start word. Two spans over the same words conflict unless `multi_label`; other
    spans conflict when they overlap (`flat`) or cross without one holding the other (nested)."""
    kept: list[Span] = []
    by_start: dict[int, list[Span]] = {}
    # The kept spans' words as arrays too, for a span near many of them (a token-level model's spans may be as wide
    # as the text): one vectorised check instead of a Python call per kept span.
    starts = np.empty(len(spans), dtype=np.int64)
    ends = np.empty(len(spans), dtype=np.int64)
    for span in sorted(spans, key=lambda one: -one.score):
        # Any span this one could conflict with starts within max_width words before it, or inside it: the kept
        # spans starting there are checked one by one, or every kept span is (fewer of them, or too many starts).
        first = span.start - max_width + 1
        starts_near = span.end + 1 - first
        if min(len(kept), starts_near) > VECTORISED_CHECK:
            conflict = _conflicts(span, starts[: len(kept)], ends[: len(kept)], flat, multi_label)
        elif len(kept) <= starts_near:
            conflict = any(_conflict(span, other, flat, multi_label) for other in kept)
        else:
            near = (other for start in range(first, span.end + 1) for other in by_start.get(start, ()))
            conflict = any(_conflict(span, other, flat, multi_label) for other in near)
        if conflict:
            continue
        starts[len(kept)], ends[len(kept)] = span.start, span.end
        kept.append(span)
        by_start.setdefault(span.start, []).append(span)
    kept.sort(key=lambda one: one.start)
    return kept


def _conflict(span: Span, other: Span, flat: bool, multi_label: bool) -> bool:
    if (span.start, span.end) == (other.start, other.end):
        return not multi_label
    overlapping = not (span.start > other.end or other.start > span.end)
    if flat:
        return overlapping
    nested = (span.start <= other.start and span.end >= other.end) or (
        other.start <= span.start and other.end >= span.end
    )
    return overlapping and not nested


def _conflicts(span: Span, starts: np.ndarray, ends: np.ndarray, flat: bool, multi_label: bool) -> bool:
    """`_conflict` of `span` against every kept span at once (their first and last words)."""
    same = (starts == span.start) & (ends == span.end)
    if not multi_label and same.any():
        return True
    overlapping = (starts <= span.end) & (span.start <= ends) & ~same
    if not flat:
        holds = (span.start <= starts) & (ends <= span.end)
        held = (starts <= span.start) & (span.end <= ends)
        overlapping &= ~(holds | held)
    return bool(overlapping.any())


def merge_adjacent(entities: list[dict], text: str) -> list[dict]:
    """Entities of one label that touch (or leave one character between them) merged into one, scored by the
    higher: what token-level models' word-by-word spans need (the public server's `merge_adjacent_entities`)."""
    merged: list[dict] = []
    for entity in sorted(entities, key=lambda one: one["start"]):
        last = merged[-1] if merged else None
        if last is not None and last["label"] == entity["label"] and entity["start"] <= last["end"] + 1:
            end = max(last["end"], entity["end"])
            merged[-1] = {**last, "end": end, "text": text[last["start"] : end],
                          "score": max(last["score"], entity["score"])}  # fmt: skip
        else:
            merged.append(entity)
    return merged
