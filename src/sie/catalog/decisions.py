"""Typed decisions (GLiNER2.5-Decide, `sie_server.adapters.gliner2.decide`): the three request shapes such a model
answers, read into the classification tasks it scores in one row, checked before anything is queued.

- `output_schema`: typed questions `{question_id: {"type", "instructions", "criteria", "labels"?}}`, as the public
  Laya models take them. `choice`: one label per criterion (a dict of label → description, or a list of labels);
  `score`: levels "0" … "k-1", each described by its criterion; `noul`: a yes/no question whose labels are "yes" and
  "no" (or `labels: {"false": …, "true": …}`), described by `criteria["true"]` / `["false"]`. Answers in
  `data[question_id]`.
- `options.label_groups`: `{group: [label, …]}`, each group a task (GLiClass's spelling), the request's
  `instruction` each one's prompt; answers in `data[group]` and `group.label` classifications.
- `labels`: one task named `options.classification_task` ("label" by default), `instruction` its prompt; every label
  a classification.

A task is single-label (a softmax over its labels) unless `multi_label` (or `classification_type: multi-label`) asks
for a sigmoid per label.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import attrs

TaskKind = Literal["choice", "score", "noul", "group", "labels"]
QUESTION_TYPES: Final = ("choice", "score", "noul")
MAX_TASKS: Final = 64  # questions or label groups per request (each is read in every item's one row)
MAX_LABELS_PER_TASK: Final = 64
MAX_LABELS: Final = 1024  # labels across a request's tasks
MAX_NAME_CHARS: Final = 128  # a task name (question id, group name)
MAX_LABEL_CHARS: Final = 256
MAX_TEXT_CHARS: Final = 2048  # a prompt (instructions) or a label's description
MAX_SCHEMA_CHARS: Final = 65_536  # every string of a request's tasks together
DEFAULT_TASK: Final = "label"
NOUL_WORDS: Final = ("no", "yes")  # a noul question's (false, true) labels unless it names its own
# Words the model reads as its prompt's structure: a task name, label, prompt or description holding one is refused.
MARKERS: Final = ("[P]", "[L]", "[C]", "[E]", "[R]", "[DESCRIPTION]", "[EXAMPLE]", "[OUTPUT]", "[SEP_STRUCT]",
                  "[SEP_TEXT]")  # fmt: skip


@attrs.frozen
class DecisionTask:
    """One classification task the model reads, and how its answer is reported: `key` in `data` (question id or
    group name), the `labels` the model reads and the `keys` they answer as (a score question's level indexes, a noul
    question's "true" and "false"), each label's description, the task's prompt, a score question's levels."""

    key: str
    kind: TaskKind
    labels: tuple[str, ...]
    keys: tuple[str, ...]
    descriptions: tuple[str | None, ...]
    prompt: str | None = None
    multi_label: bool = False
    legend: tuple[Any, ...] = ()

    @property
    def schema_prompt(self) -> str:
        """What the model reads after the task's `[P]`: `name: prompt`, then ` [DESCRIPTION] label: description` for
        each described label, as gliner2's processor writes a classification schema."""
        text = f"{self.key}: {self.prompt}" if self.prompt else self.key
        for label, description in zip(self.labels, self.descriptions, strict=True):
            if description:
                text += f" [DESCRIPTION] {label}: {description}"
        return text


@attrs.frozen
class DecisionRequest:
    """A request's tasks in order, how they answer (`questions`, `groups` or `labels`) and its score threshold."""

    mode: Literal["questions", "groups", "labels"]
    tasks: tuple[DecisionTask, ...]
    threshold: float = 0.0


def read_decisions(
    labels: Any, output_schema: Any, instruction: Any, options: Mapping[str, Any] | None
) -> DecisionRequest:
    """The tasks a request asks for; ValueError naming the first thing that cannot be read."""
    options = options or {}
    groups = options.get("label_groups")
    if output_schema is not None:
        if labels:
            raise ValueError("Field 'labels' does not apply with 'output_schema' (typed questions)")
        if groups is not None:
            raise ValueError("Option 'label_groups' does not apply with 'output_schema' (typed questions)")
        if instruction is not None:
            raise ValueError("Field 'instruction' does not apply with 'output_schema': each question has its own "
                             "'instructions'")  # fmt: skip
        request = DecisionRequest("questions", _question_tasks(output_schema))
    else:
        prompt = _free_text(instruction, "Field 'instruction'")
        multi_label = _multi_label(options)
        threshold = float(options.get("threshold", 0.0))
        if groups is not None:
            if labels:
                raise ValueError("Field 'labels' does not apply with option 'label_groups'")
            request = DecisionRequest("groups", _group_tasks(groups, prompt, multi_label), threshold)
        elif labels:
            task = options.get("classification_task")
            request = DecisionRequest("labels", (_labels_task(labels, task, prompt, multi_label),), threshold)
        else:
            raise ValueError("A typed-decision model needs typed questions in 'output_schema' ({question_id: "
                             "{type, instructions, criteria}}), option 'label_groups', or 'labels'")  # fmt: skip
    _check_totals(request)
    return request


def _question_tasks(questions: Any) -> tuple[DecisionTask, ...]:
    if not isinstance(questions, Mapping) or not questions:
        raise ValueError("Field 'output_schema' must map question ids to question definitions")
    if len(questions) > MAX_TASKS:
        raise ValueError(f"Field 'output_schema' has {len(questions)} questions; at most {MAX_TASKS} are accepted")
    tasks = tuple(_question_task(str(qid), definition) for qid, definition in questions.items())
    _check_unique(tasks)
    return tasks


def _question_task(qid: str, definition: Any) -> DecisionTask:
    where = f"question {qid!r}"
    if not isinstance(definition, Mapping):
        raise ValueError(f"{where}: the definition must be an object")
    kind = definition.get("type")
    if kind not in QUESTION_TYPES:
        raise ValueError(f"{where}: type must be one of {list(QUESTION_TYPES)}")
    if "instructions" not in definition:
        raise ValueError(f"{where}: no 'instructions'; add the text the model should answer")
    if "labels" in definition and kind != "noul":
        raise ValueError(f"{where}: 'labels' is read by noul questions only")
    instructions = definition["instructions"]
    if not isinstance(instructions, str):
        instructions = _json(instructions, f"{where}: 'instructions'")
    name = _name(qid, f"{where}: the question id", MAX_NAME_CHARS)
    prompt = _free_text(instructions, f"{where}: 'instructions'")
    read = {"choice": _choice_task, "score": _score_task, "noul": _noul_task}[kind]
    return read(name, prompt, definition, where)


def _choice_task(name: str, prompt: str | None, definition: Mapping[str, Any], where: str) -> DecisionTask:
    criteria = definition.get("criteria")
    if isinstance(criteria, list) and all(isinstance(label, str) for label in criteria):
        criteria = dict.fromkeys(criteria)  # labels without descriptions
    if not isinstance(criteria, Mapping) or not criteria or not all(isinstance(key, str) for key in criteria):
        raise ValueError(f"{where}: a choice question takes 'criteria' as a non-empty object of label -> "
                         "description, or a list of labels")  # fmt: skip
    _check_count(len(criteria), where)
    keys = tuple(criteria)
    descriptions = tuple(_description(value, where) for value in criteria.values())
    return DecisionTask(name, "choice", _labels(keys, where), keys, descriptions, prompt)


def _score_task(name: str, prompt: str | None, definition: Mapping[str, Any], where: str) -> DecisionTask:
    levels = definition.get("criteria")
    if not isinstance(levels, list) or not levels:
        raise ValueError(f"{where}: a score question takes 'criteria' as a non-empty list of level descriptions, "
                         "index 0 first")  # fmt: skip
    _check_count(len(levels), where)
    labels = tuple(str(index) for index in range(len(levels)))
    descriptions = tuple(None if _names_itself(level, label) else _description(level, where)
                         for label, level in zip(labels, levels, strict=True))  # fmt: skip
    return DecisionTask(name, "score", labels, labels, descriptions, prompt, legend=tuple(levels))


def _noul_task(name: str, prompt: str | None, definition: Mapping[str, Any], where: str) -> DecisionTask:
    criteria = definition.get("criteria")
    if criteria is not None and (not isinstance(criteria, Mapping) or len(criteria) > 2
                                 or any(str(key).lower() not in ("true", "false") for key in criteria)):  # fmt: skip
        raise ValueError(f"{where}: a noul question takes 'criteria' keyed only 'true' and 'false' (either, both, or "
                         "none)")  # fmt: skip
    described = {str(key).lower(): value for key, value in (criteria or {}).items()}
    false_word, true_word = _noul_words(definition.get("labels"), where)
    descriptions = (_description(described.get("true"), where), _description(described.get("false"), where))
    return DecisionTask(name, "noul", _labels((true_word, false_word), where), ("true", "false"), descriptions, prompt)


def _noul_words(labels: Any, where: str) -> tuple[str, str]:
    if labels is None:
        return NOUL_WORDS
    problem = f"{where}: noul 'labels' must map exactly 'false' and 'true' to distinct non-blank strings"
    if not isinstance(labels, Mapping) or set(labels) != {"false", "true"}:
        raise ValueError(problem)
    words = labels["false"], labels["true"]
    if not all(isinstance(word, str) and word.strip() for word in words) or words[0].strip() == words[1].strip():
        raise ValueError(problem)
    return words[0].strip(), words[1].strip()


def _names_itself(level: Any, label: str) -> bool:
    """A score level that only repeats its index ("0", "1", …) needs no description."""
    return level in (None, "") or (isinstance(level, str) and level.strip() == label)


def _group_tasks(groups: Any, prompt: str | None, multi_label: bool) -> tuple[DecisionTask, ...]:
    if not isinstance(groups, Mapping) or not groups:
        raise ValueError("Option 'label_groups' must be a non-empty object of group name -> labels")
    if len(groups) > MAX_TASKS:
        raise ValueError(f"Option 'label_groups' has {len(groups)} groups; at most {MAX_TASKS} are accepted")
    tasks = []
    for group, labels in groups.items():
        where = f"label_groups[{group!r}]"
        if not isinstance(labels, list) or not labels:
            raise ValueError(f"{where} must be a non-empty list of labels")
        _check_count(len(labels), where)
        name = _name(group, f"{where}: the group name", MAX_NAME_CHARS)
        read = _labels(labels, where)
        tasks.append(DecisionTask(name, "group", read, read, (None,) * len(read), prompt, multi_label))
    _check_unique(tasks)
    return tuple(tasks)


def _labels_task(labels: Any, task: Any, prompt: str | None, multi_label: bool) -> DecisionTask:
    if not isinstance(labels, list):
        raise ValueError("Field 'labels' must be a list of non-blank strings")
    _check_count(len(labels), "Field 'labels'")
    name = DEFAULT_TASK if task is None else _name(task, "Option 'classification_task'", MAX_NAME_CHARS)
    read = _labels(labels, "Field 'labels'")
    return DecisionTask(name, "labels", read, read, (None,) * len(read), prompt, multi_label)


def _multi_label(options: Mapping[str, Any]) -> bool:
    """`classification_type` (GLiClass's spelling) or `multi_label` (GLiNER2's); single-label unless one asks."""
    kind, multi_label = options.get("classification_type"), options.get("multi_label")
    if kind is None:
        return bool(multi_label)
    resolved = kind in ("multi-label", "multi", "multi_label")
    if multi_label is not None and bool(multi_label) != resolved:
        raise ValueError("Option 'multi_label' contradicts option 'classification_type'")
    return resolved


def _check_count(count: int, where: str) -> None:
    if count > MAX_LABELS_PER_TASK:
        raise ValueError(f"{where} has {count} labels; at most {MAX_LABELS_PER_TASK} are accepted per task")


def _check_unique(tasks: Sequence[DecisionTask]) -> None:
    names = [task.key for task in tasks]
    if len(set(names)) != len(names):
        raise ValueError("Question ids and label group names must be unique once surrounding whitespace is removed")


def _check_totals(request: DecisionRequest) -> None:
    labels = sum(len(task.labels) for task in request.tasks)
    if labels > MAX_LABELS:
        raise ValueError(f"The request's tasks have {labels} labels; at most {MAX_LABELS} are accepted")
    characters = sum(len(task.schema_prompt) + sum(map(len, task.labels)) for task in request.tasks)
    if characters > MAX_SCHEMA_CHARS:
        raise ValueError(f"The request's questions, labels, prompts and descriptions have {characters} characters; "
                         f"at most {MAX_SCHEMA_CHARS} are accepted")  # fmt: skip


def _labels(values: Sequence[Any], where: str) -> tuple[str, ...]:
    labels = tuple(_name(value, f"{where}: a label", MAX_LABEL_CHARS) for value in values)
    if len(set(labels)) != len(labels):
        raise ValueError(f"{where}: labels must be unique once surrounding whitespace is removed")
    return labels


def _name(value: Any, what: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-blank string")
    if len(value) > limit:
        raise ValueError(f"{what} has {len(value)} characters; at most {limit} are accepted")
    _check_markers(value, what)
    return value.strip()


def _free_text(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string")
    if len(value) > MAX_TEXT_CHARS:
        raise ValueError(f"{what} has {len(value)} characters; at most {MAX_TEXT_CHARS} are accepted")
    _check_markers(value, what)
    return value.strip() or None


def _description(value: Any, where: str) -> str | None:
    """A criterion as a label's description: a string as given, another value as compact JSON."""
    if value is None or value == "":
        return None
    text = value if isinstance(value, str) else _json(value, f"{where}: a criterion")
    return _free_text(text, f"{where}: a criterion")


def _json(value: Any, what: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be a string or JSON") from exc


def _check_markers(value: str, what: str) -> None:
    for marker in MARKERS:
        if marker in value:
            raise ValueError(f"{what} holds {marker!r}, a word of the model's prompt structure")


def confidence(probabilities: Sequence[float]) -> float:
    """1 - H(p) / log(k): how far a distribution over k labels is from uniform (1 for one label)."""
    if len(probabilities) < 2:
        return 1.0
    entropy = -sum(p * math.log(min(max(p, 1e-12), 1.0)) for p in probabilities)
    return min(max(1.0 - entropy / math.log(len(probabilities)), 0.0), 1.0)
