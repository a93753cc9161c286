"""Request options: the keys SIE reads from a request's `options`, the values each may hold, which kinds of
model read each, and the check that refuses a bad one naming the option and what it allows (issue 14 §1).

The gateway runs `option_problem` before anything is queued, so a malformed option is a 400 for its own
request and never reaches a batch it shares with other requests; the worker runs it again per item for
work that did not pass a gateway (an older one, a direct publisher), failing only that item.

Keys SIE does not know pass unchecked: they belong to a newer client or to a profile's adapter, and the
SDK merges its client-level options into every call. A key SIE knows but the model's kind does not read
(`pooling` on a cross-encoder) is refused, since silently ignoring it would answer something the caller
did not ask for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from sie.catalog.adapters import (
    CAUSAL_RERANKER,
    CONTEXT_PRUNER,
    CROSS_ENCODER,
    DENSE,
    GLICLASS,
    GLINER,
    GLINER2,
    GLINER2_DECIDE,
    GLINER_UNION,
    GLIREL,
    HYBRID,
    IMAGE_TEXT,
    MULTIVECTOR,
    NLI_CLASSIFICATION,
    SPARSE,
    TOKEN_CLASSIFICATION,
)
from sie.catalog.decisions import read_decisions
from sie.catalog.model import ENCODE_OUTPUTS
from sie.catalog.output_schema import structure_fields
from sie.wire.http import OUTPUT_DTYPES
from sie.wire.queue import OPERATION_SCORE

# "last_token" is the public catalogue's other spelling of "last".
POOLING_MODES: Final = ("mean", "cls", "last", "last_token")
# Instructions and templates are prefixes and wrappers of an item's text; one longer than this is no
# instruction, and a template repeating `{text}` would multiply the item's size.
MAX_OPTION_TEXT_CHARS: Final = 4096
TEXT_PLACEHOLDER: Final = "{text}"
LABEL_PLACEHOLDER: Final = "{}"  # where a zero-shot classifier's hypothesis template puts the label
# GLiClass label groups: each group is one more row read with the text.
MAX_LABEL_GROUPS: Final = 16
MAX_EXAMPLES: Final = 16  # GLiClass few-shot examples, each read with every text
CLASSIFICATION_TYPES: Final = ("single-label", "multi-label", "single", "multi", "single_label", "multi_label")
# One extraction label (an entity type such as "drug dosage"): longer than this is no label (the public server's
# limit too).
MAX_LABEL_CHARS: Final = 128
# Relation types one request may name (a GLiNER relation model reads them all with every text, and scores every kept
# pair of entities against each).
MAX_RELATION_LABELS: Final = 100


@attrs.frozen
class OptionRule:
    """What one option may hold: `allows` describes it to the caller, `accepts` decides."""

    allows: str
    accepts: Callable[[Any], bool]


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_text(value: Any) -> bool:
    return value is None or (isinstance(value, str) and len(value) <= MAX_OPTION_TEXT_CHARS)


def _is_template(value: Any) -> bool:
    return _is_text(value) and (value is None or value.count(TEXT_PLACEHOLDER) <= 1)


def _one_of(choices: tuple[str, ...]) -> OptionRule:
    return OptionRule(f"null or one of {list(choices)}", lambda value: value is None or value in choices)


def _is_probability(value: Any) -> bool:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and math.isfinite(value) and 0.0 <= value <= 1.0


def _is_output_types(value: Any) -> bool:
    if value is None:
        return True
    return isinstance(value, list) and bool(value) and all(kind in ENCODE_OUTPUTS for kind in value)


def _is_count(value: Any) -> bool:
    """Null, or a whole number of at least 1 (tokens, words, relation types)."""
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)


def _is_hypothesis_template(value: Any) -> bool:
    return _is_text(value) and (value is None or value.count(LABEL_PLACEHOLDER) == 1)


def _is_label_groups(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, dict) or not 1 <= len(value) <= MAX_LABEL_GROUPS:
        return False
    return all(_is_label(name) and "." not in name and isinstance(labels, list) and 1 <= len(labels) <= 100
               and all(_is_label(label) for label in labels) for name, labels in value.items())  # fmt: skip


def _is_examples(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, list) or len(value) > MAX_EXAMPLES:
        return False
    return all(
        isinstance(example, dict) and set(example) == {"text", "labels"} and _is_text(example["text"])
        and isinstance(example["text"], str) and isinstance(example["labels"], list)
        and all(_is_label(label) for label in example["labels"])
        for example in value
    )  # fmt: skip


def _is_label_list(value: Any) -> bool:
    return value is None or (
        isinstance(value, list) and len(value) <= MAX_RELATION_LABELS and all(_is_label(label) for label in value)
    )


def _is_label(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip()) and len(value) <= MAX_LABEL_CHARS


def _is_whole(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _is_optional_label(value: Any) -> bool:
    return value is None or value == "" or _is_label(value)


def _is_default_labels(value: Any) -> bool:
    return value is None or (isinstance(value, list) and bool(value) and all(_is_label(label) for label in value))


def _is_unset(value: Any) -> bool:
    return value is None or value is False or value == ""


def muvera_on(value: Any) -> bool:
    """Whether an options' `muvera` value asks for MUVERA's dense encoding: `{}` does (the public catalogue's
    `muvera` profiles), null and false do not; the encoding's settings are the profile's load-time `muvera_config`."""
    return isinstance(value, Mapping) and not value


def _is_muvera(value: Any) -> bool:
    return _is_unset(value) or muvera_on(value)


_TEXT = f"null or a string of at most {MAX_OPTION_TEXT_CHARS} characters"
RULES: Final[dict[str, OptionRule]] = {
    "profile": OptionRule("a profile name (string)", lambda value: isinstance(value, str)),
    "is_query": OptionRule("true or false", _is_bool),
    "instruction": OptionRule(_TEXT, _is_text),
    "query_template": OptionRule(f"{_TEXT} holding {TEXT_PLACEHOLDER} at most once", _is_template),
    "doc_template": OptionRule(f"{_TEXT} holding {TEXT_PLACEHOLDER} at most once", _is_template),
    "truncate": OptionRule("true or false", _is_bool),
    "output_types": OptionRule(f"null or a non-empty list of {list(ENCODE_OUTPUTS)}", _is_output_types),
    "output_dtype": _one_of(OUTPUT_DTYPES),
    "pooling": _one_of(POOLING_MODES),
    "normalize": OptionRule("true or false", _is_bool),
    "threshold": OptionRule("a number from 0 to 1", _is_probability),
    "prune_threshold": OptionRule("a number from 0 to 1", _is_probability),
    "highlight_threshold": OptionRule("a number from 0 to 1", _is_probability),
    # Zero-shot span extraction (GLiNER): overlapping spans, several labels per span, shorter spans than the model's.
    "flat_ner": OptionRule("true or false", _is_bool),
    "multi_label": OptionRule("true or false", _is_bool),
    "max_width": OptionRule("null or a whole number of words (at least 1)", _is_count),
    "merge_adjacent_entities": OptionRule("true or false", _is_bool),
    # Relation extraction (GLiREL): the most relation types kept for one pair of entities.
    "top_k": OptionRule("null or a whole number of relation types (at least 1)", _is_count),
    # GLiClass: exclusive or independent labels, and several label sets at once ({"group": [labels]}).
    "classification_type": _one_of(CLASSIFICATION_TYPES),
    "label_groups": OptionRule(
        f"null or an object of at most {MAX_LABEL_GROUPS} groups, each named without '.' and listing 1 to 100 "
        f"non-blank labels of at most {MAX_LABEL_CHARS} characters",
        _is_label_groups,
    ),
    "examples": OptionRule(
        f'null or a list of at most {MAX_EXAMPLES} objects {{"text": a string of at most {MAX_OPTION_TEXT_CHARS} '
        f'characters, "labels": a list of non-blank labels of at most {MAX_LABEL_CHARS} characters}}',
        _is_examples,
    ),
    # A union of GLiNER models (superlinked/pii-redact): the lowest span score kept, the word windows a long text is
    # read in, the label whose name tokens are found again wherever they recur, and the labels of a request naming
    # none (window_overlap below window_words is checked with the two together, by the model).
    "score_floor": OptionRule("a number from 0 to 1", _is_probability),
    "window_words": OptionRule("a whole number of words (at least 2)", lambda value: _is_whole(value, 2)),
    "window_overlap": OptionRule("a whole number of words (at least 0)", lambda value: _is_whole(value, 0)),
    "propagate_label": OptionRule(
        f'null, "" (off) or a non-blank label of at most {MAX_LABEL_CHARS} characters', _is_optional_label
    ),
    "name_min_letters": OptionRule("a whole number of letters (at least 1)", lambda value: _is_whole(value, 1)),
    "default_labels": OptionRule(
        f"null or a non-empty list of non-blank labels of at most {MAX_LABEL_CHARS} characters", _is_default_labels
    ),
    # GLiNER2: classify the text (the task's name read with its labels) instead of extracting entities, and the label a
    # long text takes when any window of it does (a guard's "unsafe").
    "classification_task": OptionRule(
        f"null or a non-blank task name of at most {MAX_LABEL_CHARS} characters",
        lambda value: value is None or _is_label(value),
    ),
    "positive_label": OptionRule(
        f"null or a non-blank label of at most {MAX_LABEL_CHARS} characters",
        lambda value: value is None or _is_label(value),
    ),
    # Zero-shot classification by entailment: the hypothesis each label becomes.
    "hypothesis_template": OptionRule(f"{_TEXT} holding {LABEL_PLACEHOLDER} exactly once", _is_hypothesis_template),
    # A GLiNER relation-extraction model's relation types (another GLiNER refuses them per item), and the score a
    # relation must pass (the entity threshold unless set).
    "relation_labels": OptionRule(
        f"null or a list of at most {MAX_RELATION_LABELS} non-blank strings of at most {MAX_LABEL_CHARS} characters",
        _is_label_list,
    ),
    "relation_threshold": OptionRule("a number from 0 to 1", _is_probability),
    # Token limits below the model's own: every text of a text encoder, and a multi-vector model's queries.
    "max_seq_length": OptionRule("null or a whole number of tokens (at least 1)", _is_count),
    "query_max_length": OptionRule("null or a whole number of tokens (at least 1)", _is_count),
    # Features of the public server this one does not have: only their "off" values are accepted.
    "lora_id": OptionRule("null (LoRA adapters are not supported)", _is_unset),
    "lora": OptionRule("null (LoRA adapters are not supported)", _is_unset),
    # A multi-vector model's MUVERA encoding, returned as `dense` (sie.worker.muvera); its settings are load-time.
    "muvera": OptionRule(
        "null, false, or {} (MUVERA's dense encoding, as the profile's muvera_config sets it)", _is_muvera
    ),
}

_EVERY_KIND: Final = frozenset({"profile", "is_query", "lora_id", "lora", "muvera"})
_TEXT_ENCODER: Final = _EVERY_KIND | {
    "instruction",
    "query_template",
    "doc_template",
    "truncate",
    "output_types",
    "output_dtype",
    "max_seq_length",
}
# The options each kind of model reads (`sie.catalog.adapters`) in its own operation: encode for the text
# encoders, score for the cross-encoder, extract for entity extraction.
READ_BY_KIND: Final[dict[str, frozenset[str]]] = {
    DENSE: _TEXT_ENCODER | {"pooling", "normalize"},
    SPARSE: _TEXT_ENCODER,
    MULTIVECTOR: _TEXT_ENCODER | {"query_max_length"},
    HYBRID: _TEXT_ENCODER | {"pooling", "normalize"},
    CROSS_ENCODER: _EVERY_KIND | {"instruction"},
    CAUSAL_RERANKER: _EVERY_KIND | {"instruction"},
    CONTEXT_PRUNER: _EVERY_KIND | {"instruction", "prune_threshold", "highlight_threshold"},
    TOKEN_CLASSIFICATION: _EVERY_KIND | {"threshold"},
    GLINER: _EVERY_KIND
    | {
        "threshold",
        "flat_ner",
        "multi_label",
        "max_width",
        "merge_adjacent_entities",
        "relation_labels",
        "relation_threshold",
    },
    NLI_CLASSIFICATION: _EVERY_KIND | {"hypothesis_template", "multi_label"},
    GLICLASS: _EVERY_KIND | {"threshold", "classification_type", "label_groups", "examples", "instruction"},
    GLIREL: _EVERY_KIND | {"threshold", "top_k"},
    GLINER2: _EVERY_KIND | {"threshold", "multi_label", "classification_task", "positive_label"},
    GLINER2_DECIDE: _EVERY_KIND
    | {"threshold", "multi_label", "classification_type", "label_groups", "classification_task", "instruction"},
    # Its members read at their own settings: only the composition is the request's to change.
    GLINER_UNION: _EVERY_KIND
    | {
        "score_floor",
        "window_words",
        "window_overlap",
        "propagate_label",
        "name_min_letters",
        "default_labels",
    },  # fmt: skip
    IMAGE_TEXT: _TEXT_ENCODER | {"normalize"},
}
# A text encoder scoring compares normalised representations: no vectors are returned, so nothing shapes them.
READ_WHEN_SCORING: Final = _EVERY_KIND | {"instruction", "query_template", "doc_template", "max_seq_length"}
_TEXT_ENCODERS: Final = frozenset({DENSE, SPARSE, MULTIVECTOR, HYBRID})
_KIND_NAMES: Final = {
    DENSE: "a dense embedding model",
    SPARSE: "a sparse embedding model",
    MULTIVECTOR: "a multi-vector model",
    HYBRID: "a dense, sparse and multi-vector model",
    CROSS_ENCODER: "a cross-encoder",
    CAUSAL_RERANKER: "a decoder reranker",
    CONTEXT_PRUNER: "a context pruner",
    TOKEN_CLASSIFICATION: "an entity extraction model",
    GLINER: "a zero-shot entity extraction model",
    NLI_CLASSIFICATION: "a zero-shot classification model",
    GLICLASS: "a GLiClass classification model",
    GLIREL: "a zero-shot relation extraction model",
    GLINER_UNION: "a union of zero-shot entity extraction models",
    GLINER2: "a GLiNER2 extraction and classification model",
    GLINER2_DECIDE: "a typed-decision model (GLiNER2.5-Decide)",
    IMAGE_TEXT: "an image–text embedding model",
}


def options_read(kind: str | None, operation: str) -> frozenset[str] | None:
    """The options a model of `kind` reads in `operation`; None for a kind SIE does not know."""
    if kind in _TEXT_ENCODERS and operation == OPERATION_SCORE:
        return READ_WHEN_SCORING | {"query_max_length"} if kind == MULTIVECTOR else READ_WHEN_SCORING
    return READ_BY_KIND.get(kind or "")


def option_problem(options: Mapping[str, Any] | None, kind: str | None, operation: str) -> str | None:
    """Why request `options` cannot run in `operation` on a model of adapter `kind` (None when unknown: values
    are still checked), as a message naming the first bad option and what it allows; None when they can."""
    read = options_read(kind, operation)
    for key, value in (options or {}).items():
        rule = RULES.get(key)
        if rule is None:
            continue
        if read is not None and key not in read:
            when = " when scoring" if operation == OPERATION_SCORE and kind in _TEXT_ENCODERS else ""
            model = _KIND_NAMES[kind or ""]
            return f"Option '{key}' does not apply to {model}{when}; it reads {sorted(read)}"
        if not rule.accepts(value):
            return f"Option '{key}' must be {rule.allows}; got {_shown(value)}"
        if key == "muvera" and muvera_on(value) and kind is not None and kind != MULTIVECTOR:
            return f"Option 'muvera' folds a multi-vector model's token vectors; this is {_KIND_NAMES[kind]}"
    return None


def _shown(value: Any) -> str:
    """The offending value as the caller sent it, cut short (it may be large)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


# Kinds of model that read the labels of each request (and need some), rather than filter their own.
ZERO_SHOT_KINDS: Final = frozenset({GLINER, NLI_CLASSIFICATION, GLICLASS, GLIREL, GLINER2_DECIDE})


def labels_problem(
    labels: Any, kind: str | None, max_labels: int, options: Mapping[str, Any] | None = None
) -> str | None:
    """Why an extract request's `labels` cannot run on a model of adapter `kind`: more than `max_labels`, one that
    is not a non-blank string of at most MAX_LABEL_CHARS characters, or none for a zero-shot model, which extracts
    only the labels it is given (a GLiClass model may be given `label_groups` in `options` instead); None when they
    can."""
    if (labels is None or labels == []) and kind == GLINER_UNION:
        # A union reads the request's default labels when it names none (and the profile's when neither does).
        labels = (options or {}).get("default_labels")
    if labels is None or labels == []:
        grouped = kind in (GLICLASS, GLINER2_DECIDE) and bool((options or {}).get("label_groups"))
        needed = kind in ZERO_SHOT_KINDS and not grouped
        return "Field 'labels' is required: a zero-shot model extracts the labels it is given" if needed else None
    if not isinstance(labels, list):
        return "Field 'labels' must be a list of strings"
    if len(labels) > max_labels:
        return f"Field 'labels' has {len(labels)} labels; at most {max_labels} are accepted (SIE_GATEWAY_MAX_LABELS)"
    for index, label in enumerate(labels):
        if not _is_label(label):
            return (f"Label {index} must be a non-blank string of at most {MAX_LABEL_CHARS} characters; "
                    f"got {_shown(label)}")  # fmt: skip
    return None


def structure_problem(
    output_schema: Any, labels: Any, kind: str | None, max_labels: int, options: Mapping[str, Any] | None = None
) -> str | None:
    """Why an extract request's `output_schema` cannot run on a model of adapter `kind`: only a GLiNER2 model fills
    one, without labels or a classification task beside it, its fields and enum values (which the model reads like
    labels) at most `max_labels` and each a sane string (`sie.catalog.output_schema`); a typed-decision model reads
    it as typed questions (`sie.catalog.decisions`); None when it can."""
    if kind == GLINER2_DECIDE:  # typed questions, not a structure
        try:
            read_decisions(labels, output_schema, None, options)
        except ValueError as exc:
            return str(exc)
        return None
    if kind != GLINER2:
        return "Field 'output_schema' is read by GLiNER2 models only"
    if labels:
        return "Field 'labels' does not apply with 'output_schema': the schema's properties are what is extracted"
    if (options or {}).get("classification_task") is not None:
        return "Option 'classification_task' does not apply with 'output_schema'"
    try:
        fields = structure_fields(output_schema, MAX_LABEL_CHARS)
    except ValueError as exc:
        return str(exc)
    read = len(fields) + sum(len(field.choices or ()) for field in fields)
    if read > max_labels:
        return (f"Field 'output_schema' has {read} properties and enum values; at most {max_labels} are accepted "
                "(SIE_GATEWAY_MAX_LABELS)")  # fmt: skip
    return None


# Entities one relation-extraction item may name (`metadata.entities`): every ordered pair of them is scored (the
# public server's limit too).
MAX_ENTITIES: Final = 256


def entities_problem(text: str, entities: Any) -> str | None:
    """Why an item's `metadata.entities` cannot be read against `text`: not a list, none or more than MAX_ENTITIES,
    or one that is not an object with integer offsets 0 <= start < end <= len(text) covering some non-space text;
    None when they can."""
    if not isinstance(entities, list) or not entities:
        return "Relations are read between the entities each item names: send metadata.entities, a non-empty list"
    if len(entities) > MAX_ENTITIES:
        return f"metadata.entities has {len(entities)} entities; at most {MAX_ENTITIES} are accepted"
    for index, entity in enumerate(entities):
        if not isinstance(entity, dict):
            return f"metadata.entities[{index}] must be an object with 'start' and 'end' character offsets"
        start, end = entity.get("start"), entity.get("end")
        if not all(isinstance(value, int) and not isinstance(value, bool) for value in (start, end)):
            return f"metadata.entities[{index}] needs integer 'start' and 'end' character offsets"
        if not 0 <= start < end <= len(text):
            return (f"metadata.entities[{index}] spans [{start}, {end}): offsets must hold 0 <= start < end <= "
                    f"{len(text)} (the text's length)")  # fmt: skip
        if not text[start:end].strip():
            return f"metadata.entities[{index}] spans [{start}, {end}), which covers no word of the text"
        label = entity.get("label")
        if label is not None and not isinstance(label, str):
            return f"metadata.entities[{index}].label must be a string"
    return None


# The chat template switches a catalogue entry (`tasks.generate.chat_template_kwargs`, a profile's) or a chat request
# may set: the public server's bounded set, granite-guardian's one setting and its length.
CHAT_TEMPLATE_SWITCHES: Final = ("enable_thinking", "guardian_config")
GUARDIAN_CONFIG_KEYS: Final = ("risk_name",)
MAX_RISK_NAME_CHARS: Final = 128


def chat_template_problem(value: Any, field: str = "chat_template_kwargs") -> str | None:
    """Why `value` cannot be a chat template's switches (named as `field`), or None when it can (None included)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return f"{field} must be an object, got {_shown(value)}"
    unknown = sorted(set(value) - set(CHAT_TEMPLATE_SWITCHES))
    if unknown:
        return f"{field} {unknown} are not chat template switches SIE passes; expected {list(CHAT_TEMPLATE_SWITCHES)}"
    if "enable_thinking" in value and not isinstance(value["enable_thinking"], bool):
        return f"{field}.enable_thinking must be true or false, got {_shown(value['enable_thinking'])}"
    if "guardian_config" in value:
        guardian = value["guardian_config"]
        risk = guardian.get("risk_name") if isinstance(guardian, Mapping) else None
        if (not isinstance(guardian, Mapping) or set(guardian) - set(GUARDIAN_CONFIG_KEYS) or not isinstance(risk, str)
                or not 1 <= len(risk) <= MAX_RISK_NAME_CHARS):  # fmt: skip
            return (f"{field}.guardian_config must be {{risk_name: a string of 1 to {MAX_RISK_NAME_CHARS} "
                    f"characters}}, got {_shown(guardian)}")  # fmt: skip
    return None
