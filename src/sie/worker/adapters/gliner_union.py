"""A union of GLiNER models served as one extraction model (the public catalogue's `superlinked/pii-redact`:
`urchade/gliner_multi_pii-v1` with `numind/NuNER_Zero`), composed as SIE's PII redaction study composes them:

1. Windows: a text of more than `window_words` words (GLiNER's words) is read as windows of that many words, each
   sharing `window_overlap` words with the next; every window's spans are moved back to the text's offsets.
2. Members: every member reads every window with the request's labels at its own settings (its load-time
   `options`); spans scoring below `score_floor` are dropped.
3. Union: spans of one start, end and label are one span at the best score; other overlaps are all kept.
4. Names: with `propagate_label`, every other whole-word, case-sensitive occurrence of a run of at least
   `name_min_letters` letters from a span of that label, not already inside a span, becomes a span of that label
   scoring as the best span it came from.

The first member is the model's own checkpoint; the others are named by the load-time `members` option (a Hub id at
a pinned revision and the GLiNER options it runs with). The loader loads each as a GLiNER model and hands them over
in `AdapterContext.members`. A request naming no labels reads `default_labels`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final

import attrs

from sie.catalog.adapters import GLINER, GLINER_UNION
from sie.catalog.model import DEFAULT_PROFILE, ModelConfig, Profile
from sie.catalog.options import option_problem
from sie.wire.ipc_batch import OP_EXTRACT, ExtractBatchItem
from sie.worker.adapters.base import (
    Adapter,
    AdapterContext,
    BatchResult,
    ItemResult,
    Stopwatch,
    entity_result,
    invalid,
)
from sie.worker.adapters.encoder import item_text
from sie.worker.adapters.zero_shot import split_requests, zero_shot_refusal
from sie.worker.spans import WORD_PATTERN

# How every member is served: a GLiNER model of any architecture the gliner kind runs.
MEMBER_ADAPTER: Final = "sie.adapters.gliner"
# The GLiNER options a member may run with (the request's own options go to the composition, not the members).
MEMBER_OPTIONS: Final = frozenset({"threshold", "flat_ner", "multi_label", "max_width", "merge_adjacent_entities"})
_COMMIT = re.compile(r"[0-9a-f]{40}")
# A letter: a word character that is neither a digit nor an underscore.
_LETTER: Final = r"[^\W\d_]"


@attrs.frozen
class Composition:
    """How the members' spans are composed: the profile's runtime options overlaid by the request's."""

    score_floor: float = 0.0
    window_words: int = 300
    window_overlap: int = 50
    propagate_label: str | None = None
    name_min_letters: int = 3
    default_labels: tuple[str, ...] = ()

    @classmethod
    def read(cls, options: Mapping[str, Any]) -> Composition:
        """The composition `options` ask for; ValueError naming the first option that cannot be read."""
        known = {field.name for field in attrs.fields(cls)}
        given = {key: value for key, value in options.items() if key in known and value is not None}
        problem = option_problem(given, GLINER_UNION, OP_EXTRACT)
        if problem is not None:
            raise ValueError(problem)
        composition = cls(**given)
        if composition.window_overlap >= composition.window_words:
            raise ValueError(f"Option 'window_overlap' ({composition.window_overlap}) must be less than "
                             f"'window_words' ({composition.window_words})")  # fmt: skip
        return attrs.evolve(composition, propagate_label=composition.propagate_label or None,
                            default_labels=tuple(composition.default_labels))  # fmt: skip


@attrs.frozen
class Span:
    """A span found in a text, in the text's character offsets; `label` is the label's text."""

    start: int
    end: int
    label: str
    score: float


def member_configs(model: ModelConfig, profile: Profile) -> list[ModelConfig]:
    """Every member as a GLiNER model of its own, the model's own checkpoint first; ValueError naming what in the
    `members` load-time option cannot be served."""
    loadtime = dict(profile.loadtime_options)
    members = loadtime.pop("members", None)
    if not isinstance(members, list) or not members:
        raise ValueError("a GLiNER union needs at least one other model in the load-time option 'members'")
    own = attrs.evolve(profile, name=DEFAULT_PROFILE, extends=None, adapter_path=MEMBER_ADAPTER,
                       adapter_options={"loadtime": loadtime})  # fmt: skip
    configs = [attrs.evolve(model, profiles={DEFAULT_PROFILE: own})]
    for index, member in enumerate(members):
        where = f"members[{index}]"
        if not isinstance(member, Mapping) or not set(member) <= {"model", "revision", "options"}:
            raise ValueError(f"{where} must be a mapping of model, revision and options")
        name, revision, options = member.get("model"), member.get("revision"), dict(member.get("options") or {})
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{where} needs a model (a Hugging Face id)")
        if not isinstance(revision, str) or not _COMMIT.fullmatch(revision):
            raise ValueError(f"{where} ({name}) needs a revision pinned to a full commit SHA; got {revision!r}")
        unknown = sorted(set(options) - MEMBER_OPTIONS)
        if unknown:
            raise ValueError(f"{where} ({name}) sets {unknown}; a member runs with {sorted(MEMBER_OPTIONS)}")
        problem = option_problem(options, GLINER, OP_EXTRACT)
        if problem is not None:
            raise ValueError(f"{where} ({name}): {problem}")
        member_profile = Profile(
            DEFAULT_PROFILE,
            adapter_path=MEMBER_ADAPTER,
            max_batch_tokens=profile.max_batch_tokens,
            adapter_options={"runtime": options},
        )
        configs.append(ModelConfig(sie_id=name, profiles={DEFAULT_PROFILE: member_profile}, hf_id=name,
                                   hf_revision=revision, tasks=model.tasks,
                                   max_sequence_length=model.max_sequence_length))  # fmt: skip
    return configs


def word_windows(text: str, size: int, overlap: int) -> list[tuple[int, int]]:
    """`size`-word windows of `text`, each sharing `overlap` words with the next, as (start, end) character ranges;
    a text of at most `size` words is one range over all of it."""
    words = [match.span() for match in WORD_PATTERN.finditer(text)]
    if len(words) <= size:
        return [(0, len(text))]
    windows = []
    for first in range(0, len(words), size - overlap):
        last = min(first + size, len(words)) - 1
        windows.append((words[first][0], words[last][1]))
        if last == len(words) - 1:
            break
    return windows


def union_spans(member_spans: Sequence[Sequence[Span]], floor: float) -> list[Span]:
    """The members' spans scoring `floor` or more, one per (start, end, label) at its best score, by position."""
    best: dict[tuple[int, int, str], Span] = {}
    for spans in member_spans:
        for span in spans:
            key = (span.start, span.end, span.label)
            if span.score >= floor and (key not in best or span.score > best[key].score):
                best[key] = span
    return sorted(best.values(), key=lambda span: (span.start, span.end))


def propagate_names(text: str, spans: Sequence[Span], label: str, min_letters: int) -> list[Span]:
    """A `label` span for every other whole-word, case-sensitive occurrence of a name in `text`: a run of at least
    `min_letters` letters inside a `label` span, scoring as the best span it came from. An occurrence already
    inside a span is not added."""
    name = re.compile(f"{_LETTER}{{{min_letters},}}")
    best: dict[str, float] = {}
    for span in spans:
        if span.label == label:
            for token in name.findall(text[span.start : span.end]):
                best[token] = max(best.get(token, span.score), span.score)
    added = []
    for token in sorted(best):
        for match in re.finditer(f"(?<!{_LETTER}){re.escape(token)}(?!{_LETTER})", text):
            start, end = match.span()
            if not any(span.start <= start and end <= span.end for span in spans):
                added.append(Span(start, end, label, best[token]))
    return added


def compose(text: str, member_spans: Sequence[Sequence[Span]], composition: Composition) -> list[Span]:
    """One text's union of the members' spans, then its propagated names, by position."""
    spans = union_spans(member_spans, composition.score_floor)
    if composition.propagate_label:
        spans += propagate_names(text, spans, composition.propagate_label, composition.name_min_letters)
    return sorted(spans, key=lambda span: (span.start, span.end))


@attrs.frozen
class _Request:
    """One valid item: its text, labels, windows and composition."""

    text: str
    labels: list[str]
    windows: list[tuple[int, int]]
    composition: Composition


class GlinerUnionAdapter(Adapter):
    """`sie.adapters.gliner_union`: extract only; the members are GlinerAdapters the loader built."""

    kind: ClassVar[str | None] = GLINER_UNION
    supports_extract: ClassVar[bool] = True

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        if len(context.members) < 2:
            raise ValueError("a GLiNER union serves two models or more")
        self.members = list(context.members)
        self.composition = Composition.read(self.runtime_options)  # the profile's own options must be readable

    def close(self) -> None:
        for member in self.members:
            member.close()

    def extract(self, items: Sequence[Any]) -> BatchResult:
        results, requests = split_requests(items, self._request)
        total = BatchResult(results)
        if not requests:
            return total
        rows, owners, offsets = [], [], []
        for index, request in requests.items():
            item = items[index]
            for number, (start, end) in enumerate(request.windows):
                rows.append(ExtractBatchItem(
                    work_item_id=f"{item.work_item_id}.w{number}", request_id=item.request_id, item_index=number,
                    total_items=len(request.windows), timestamp=item.timestamp,
                    item={"text": request.text[start:end]}, labels=request.labels,
                ))  # fmt: skip
                owners.append(index)
                offsets.append(start)
        found: dict[int, list[list[Span]]] = {index: [[] for _ in self.members] for index in requests}
        tokens = dict.fromkeys(requests, 0)
        failed: dict[int, ItemResult] = {}
        for position, member in enumerate(self.members):
            answer = member.extract(rows)
            total.tokenization_ms += answer.tokenization_ms
            total.inference_ms += answer.inference_ms
            total.postprocessing_ms += answer.postprocessing_ms
            for row, (owner, offset) in enumerate(zip(owners, offsets, strict=True)):
                result = answer.items[row]
                if not result.ok:
                    failed.setdefault(owner, result)
                    continue
                tokens[owner] += result.input_tokens
                found[owner][position] += [
                    Span(entity["start"] + offset, entity["end"] + offset, entity["label"], float(entity["score"]))
                    for entity in result.result["entities"]
                ]
        watch = Stopwatch()
        with watch.stage("postprocessing"):
            for index, request in requests.items():
                if index in failed:
                    results[index] = failed[index]
                    continue
                spans = compose(request.text, found[index], request.composition)
                results[index] = ItemResult(entity_result([
                    {"text": request.text[s.start : s.end], "label": s.label, "score": s.score, "start": s.start,
                     "end": s.end, "bbox": None} for s in spans
                ]), input_tokens=tokens[index])  # fmt: skip
        total.postprocessing_ms += watch.finish(results).postprocessing_ms
        return total

    def _request(self, item: Any) -> _Request | ItemResult:
        refused = zero_shot_refusal(self, item)
        if refused is not None:
            return refused
        try:
            composition = Composition.read(self.options_for(item.options))
        except ValueError as exc:
            return invalid(str(exc))
        labels = list(item.labels or composition.default_labels)
        if not labels:
            return invalid(f"Model '{self.model.sie_id}' needs labels: send labels, or the option default_labels")
        text = item_text(item.item) or ""
        windows = word_windows(text, composition.window_words, composition.window_overlap)
        return _Request(text, labels, windows, composition)
