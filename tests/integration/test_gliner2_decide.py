"""GLiNER2.5-Decide typed decisions served through the worker against the `gliner2` package on the same tiny random
GLiNER2 span checkpoint: each task's label logits equal gliner2's for the same classification schema (tasks, prompts
and label descriptions read together in one row; gliner2's multi-label sigmoids give every label's logit), and the
answers are built from them as the public server builds them — labels, label groups (single- and multi-label) and
typed questions (choice, score, noul); what cannot be read is refused per item."""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np
import pytest

from sie.catalog import parse_model_config
from sie.catalog.decisions import confidence
from support.worker_items import extract_items
from support.zero_shot_checkpoints import save_gliner2

TOLERANCE = 1e-4
TEXTS = ["Apple released a new phone and fans loved it", "The match ended in a draw after extra time."]


@pytest.fixture(scope="module", params=["deberta-v2", "modernbert"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, model_loader) -> tuple[Any, Any]:
    """A Decide model on DeBERTa-v3's backbone (GLiNER2.5-Decide) and on ModernBERT's (Decide-1B's Ettin encoder)."""
    directory = tmp_path_factory.mktemp(f"decide-{request.param}")
    reference = save_gliner2(directory, seed=11, backbone=request.param)
    model = parse_model_config({
        "sie_id": f"acme/gliner2-decide-{request.param}", "weights_path": str(directory / "gliner2"),
        "tasks": {"extract": {}},
        "profiles": {"default": {"adapter_path": "sie_server.adapters.gliner2.decide:GLiNER2DecideAdapter",
                                 "max_batch_tokens": 4096}},
    })  # fmt: skip
    return reference, model_loader.load(model, "default", model.sie_id).adapter


def logits(reference: Any, text: str, tasks: list[tuple[str, list[str], dict[str, str], str | None]]) -> list[list]:
    """gliner2's label logits for `tasks` (name, labels, descriptions, prompt) read together: each label's sigmoid
    from a multi-label task of every label, turned back into its logit."""
    schema = reference.create_schema()
    for name, labels, descriptions, prompt in tasks:
        described = {label: descriptions[label] for label in labels if label in descriptions}
        extra = {"prompt": prompt} if prompt else {}
        schema.classification(name, {label: described.get(label, "") for label in labels} if described else labels,
                              multi_label=True, cls_threshold=0.0, **extra)  # fmt: skip
        if described:  # only the described labels carry a description, as the adapter writes them
            schema.schema["classifications"][-1]["label_descriptions"] = described
    found = reference.extract(text, schema, threshold=0.0, include_confidence=True)
    out = []
    for name, labels, _, _ in tasks:
        probability = {entry["label"]: entry["confidence"] for entry in found[name]}
        out.append([math.log(probability[label] / (1.0 - probability[label])) for label in labels])
    return out


def softmax(values: list[float]) -> np.ndarray:
    shifted = np.exp(np.asarray(values) - max(values))
    return shifted / shifted.sum()


def test_labels_are_one_task_every_label_a_classification(served: tuple[Any, Any]) -> None:
    reference, adapter = served
    labels = ["positive", "negative", "neutral"]
    items = [attrs.evolve(item, instruction="How does the writer feel?")
             for item in extract_items(TEXTS, labels, classification_task="sentiment")]  # fmt: skip
    results = adapter.extract(items).items
    for text, result in zip(TEXTS, results, strict=True):
        assert result.ok, result.error
        (expected,) = logits(reference, text, [("sentiment", labels, {}, "How does the writer feel?")])
        probabilities = softmax(expected)
        found = {entry["label"]: entry["score"] for entry in result.result["classifications"]}
        assert np.allclose([found[label] for label in labels], probabilities, atol=TOLERANCE, rtol=0)
        scores = [entry["score"] for entry in result.result["classifications"]]
        assert scores == sorted(scores, reverse=True) and result.result["data"] == {}


@pytest.mark.parametrize("multi_label", [False, True])
def test_label_groups_are_read_together_in_one_row(served: tuple[Any, Any], multi_label: bool) -> None:
    reference, adapter = served
    groups = {"topic": ["tech", "sport", "politics"], "urgency": ["low", "high"]}
    kind = "multi-label" if multi_label else "single-label"
    (result,) = adapter.extract(extract_items([TEXTS[0]], [], label_groups=groups, classification_type=kind)).items
    assert result.ok, result.error
    expected = logits(reference, TEXTS[0], [(name, labels, {}, None) for name, labels in groups.items()])
    found = {entry["label"]: entry["score"] for entry in result.result["classifications"]}
    for (name, labels), task_logits in zip(groups.items(), expected, strict=True):
        p = 1 / (1 + np.exp(-np.asarray(task_logits))) if multi_label else softmax(task_logits)
        assert np.allclose([found[f"{name}.{label}"] for label in labels], p, atol=TOLERANCE, rtol=0)
        answer = result.result["data"][name]
        assert np.allclose([answer["probabilities"][label] for label in labels], p, atol=TOLERANCE, rtol=0)
        if multi_label:
            assert answer["labels"] == [label for label, value in zip(labels, p, strict=True) if value >= 0.5]
        else:
            assert answer["choice"] == labels[int(np.argmax(p))]
            assert abs(answer["confidence"] - confidence(p.tolist())) <= TOLERANCE


def test_typed_questions_answer_in_data(served: tuple[Any, Any]) -> None:
    reference, adapter = served
    questions = {
        "tone": {"type": "choice", "instructions": "What is the tone?",
                 "criteria": {"happy": "the writer is pleased", "angry": "the writer is upset", "flat": ""}},
        "quality": {"type": "score", "instructions": "How good is the product?",
                    "criteria": ["terrible", "1", {"note": "fine"}]},
        "bought": {"type": "noul", "instructions": "Did someone buy it?", "criteria": {"true": "a purchase happened"},
                   "labels": {"false": "nope", "true": "yep"}},
    }  # fmt: skip
    items = [attrs.evolve(item, output_schema=questions) for item in extract_items([TEXTS[0]], [])]
    (result,) = adapter.extract(items).items
    assert result.ok, result.error
    expected = logits(reference, TEXTS[0], [
        ("tone", ["happy", "angry", "flat"], {"happy": "the writer is pleased", "angry": "the writer is upset"},
         "What is the tone?"),
        ("quality", ["0", "1", "2"], {"0": "terrible", "2": '{"note": "fine"}'}, "How good is the product?"),
        ("bought", ["yep", "nope"], {"yep": "a purchase happened"}, "Did someone buy it?"),
    ])  # fmt: skip
    data = result.result["data"]
    tone, quality, bought = (softmax(values) for values in expected)
    assert data["tone"]["choice"] == ["happy", "angry", "flat"][int(np.argmax(tone))]
    assert np.allclose(list(data["tone"]["probabilities"].values()), tone, atol=TOLERANCE, rtol=0)
    assert abs(data["quality"]["score"] - float(np.dot([0, 1, 2], quality))) <= TOLERANCE
    assert data["quality"]["legend"] == {"0": "terrible", "1": "1", "2": {"note": "fine"}}
    assert abs(data["bought"]["noul"] - bought[0]) <= TOLERANCE and data["bought"]["answer"] == (bought[0] > bought[1])
    assert result.result["classifications"] == []


@pytest.mark.parametrize(
    ("labels", "schema", "options", "message"),
    [
        (["a", "b"], {"q": {"type": "noul", "instructions": "?"}}, {}, "'labels' does not apply"),
        ([], {"q": {"type": "guess", "instructions": "?"}}, {}, "type must be one of"),
        ([], {"q": {"type": "choice", "instructions": "?", "criteria": []}}, {}, "non-empty object"),
        ([], {"q": {"type": "noul", "instructions": "?", "criteria": {"maybe": "x"}}}, {}, "keyed only 'true'"),
        (["x [L] y", "z"], None, {}, "a word of the model's prompt structure"),
        (["a", " a"], None, {}, "unique"),
        ([], None, {"label_groups": {"g": ["a"]}, "classification_type": "multi-label", "multi_label": False},
         "contradicts"),
    ],
)  # fmt: skip
def test_what_cannot_be_read_is_refused_per_item(served: tuple[Any, Any], labels: list[str], schema: Any,
                                                 options: dict, message: str) -> None:  # fmt: skip
    _, adapter = served
    items = extract_items([TEXTS[0], TEXTS[1]], [labels, ["fine", "bad"]])
    items[0] = attrs.evolve(items[0], output_schema=schema, options=options or None)
    refused, served_item = adapter.extract(items).items
    assert refused.error_code == "INVALID_INPUT" and message in refused.error, refused.error
    assert served_item.ok and {entry["label"] for entry in served_item.result["classifications"]} == {"fine", "bad"}
