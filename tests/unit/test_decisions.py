"""Typed-decision requests read into tasks (`sie.catalog.decisions`): the three shapes, what each task's labels and
descriptions are, and what is refused before anything is queued."""

from __future__ import annotations

import pytest

from sie.catalog.decisions import MAX_LABELS_PER_TASK, MAX_TASKS, confidence, read_decisions


def test_typed_questions_become_tasks_with_their_labels_and_descriptions() -> None:
    request = read_decisions(None, {
        "tone": {"type": "choice", "instructions": "Tone?", "criteria": ["happy", "sad"]},
        "stars": {"type": "score", "instructions": {"ask": "how many"}, "criteria": ["none", "1", {"x": 2}]},
        "paid": {"type": "noul", "instructions": "Paid?", "criteria": {"TRUE": "money moved"}},
    }, None, {})  # fmt: skip
    tone, stars, paid = request.tasks
    assert request.mode == "questions" and request.threshold == 0.0
    assert (tone.labels, tone.descriptions, tone.schema_prompt) == (("happy", "sad"), (None, None), "tone: Tone?")
    assert stars.labels == ("0", "1", "2") and stars.descriptions == ("none", None, '{"x": 2}')
    assert stars.schema_prompt == 'stars: {"ask": "how many"} [DESCRIPTION] 0: none [DESCRIPTION] 2: {"x": 2}'
    assert (paid.labels, paid.keys, paid.descriptions) == (("yes", "no"), ("true", "false"), ("money moved", None))


def test_label_groups_and_labels_are_tasks_of_the_instruction() -> None:
    grouped = read_decisions(None, None, "Classify.", {"label_groups": {"topic": ["a", "b"]}, "multi_label": True})
    (topic,) = grouped.tasks
    assert grouped.mode == "groups" and topic.multi_label and topic.schema_prompt == "topic: Classify."
    labelled = read_decisions(["x", "y"], None, None, {"classification_task": "kind", "threshold": 0.3,
                                                       "classification_type": "single-label"})  # fmt: skip
    assert labelled.mode == "labels" and labelled.threshold == 0.3
    assert labelled.tasks[0].key == "kind" and not labelled.tasks[0].multi_label
    assert read_decisions(["x"], None, None, {}).tasks[0].key == "label"


@pytest.mark.parametrize(
    ("labels", "schema", "instruction", "options", "message"),
    [
        (None, None, None, {}, "needs typed questions"),
        (["a"], {"q": {}}, None, {}, "'labels' does not apply"),
        (None, {"q": {"type": "noul", "instructions": "?"}}, "x", {}, "'instruction' does not apply"),
        (None, {f"q{i}": {"type": "noul", "instructions": "?"} for i in range(MAX_TASKS + 1)}, None, {}, "at most"),
        (None, {"q": {"type": "choice", "instructions": "?", "criteria": [f"l{i}" for i in range(65)]}}, None, {},
         f"at most {MAX_LABELS_PER_TASK}"),
        (None, {"q": {"type": "score", "instructions": "?", "criteria": {}}}, None, {}, "non-empty list"),
        (None, {"q": {"type": "choice", "instructions": "?", "criteria": ["a"], "labels": {}}}, None, {},
         "noul questions only"),
        (None, {"q": {"type": "noul", "instructions": "?", "labels": {"false": "x", "true": " x"}}}, None, {},
         "distinct"),
        (None, {"q [SEP_TEXT]": {"type": "noul", "instructions": "?"}}, None, {}, "prompt structure"),
        (None, {"a": {"type": "noul", "instructions": "?"}, " a ": {"type": "noul", "instructions": "?"}}, None, {},
         "unique"),
        (["a"], None, 7, {}, "'instruction' must be a string"),
        (["a"], None, None, {"classification_type": "multi-label", "multi_label": False}, "contradicts"),
    ],
)  # fmt: skip
def test_what_cannot_be_read_is_refused_naming_it(labels, schema, instruction, options, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_decisions(labels, schema, instruction, options)


def test_confidence_is_one_minus_normalised_entropy() -> None:
    assert confidence([1.0, 0.0]) == 1.0 and confidence([0.5, 0.5]) == 0.0 and confidence([1.0]) == 1.0
    assert 0.0 < confidence([0.7, 0.2, 0.1]) < 1.0
