"""GLiNER2 span models (fastino's gliner2; both count modules) served through the worker against the `gliner2` package
on the same tiny random checkpoints: entities (the same spans, labels and offsets, scores within 1e-4, across
thresholds, rows of one batch with label sets of their own, a text without a sentence end), classifications of a
task (softmax and multi-label), the public YAMLs' option shapes (a guard's load-time task and default labels), long
texts read in windows, relations between the entities each item names (several types at once), and what is not
built refused per item."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from sie.catalog import parse_model_config
from sie.worker.errors import ModelLoadError
from support.worker_items import extract_items
from support.zero_shot_checkpoints import save_gliner2

TOLERANCE = 1e-4
TEXTS = [
    "Steve Jobs founded Apple in Cupertino California in 1976.",
    "Marie Curie won the Nobel Prize in Physics and Chemistry!",
    "Barack Obama was born in Honolulu, Hawaii",  # no sentence end: gliner2 reads one more word, "."
]
LABELS = ["person", "organization", "city", "award"]
COUNTING_LAYERS = ["count_lstm", "count_lstm_v2"]
SCHEMA = {
    "type": "object",
    "properties": {
        "founder": {"type": "string", "description": "the person who founded it"},
        "places": {"type": "array", "items": {"type": "string"}},
        "year": {"type": "string", "title": "a year"},
        "tone": {"type": "string", "enum": ["positive", "very neutral", "negative"]},
        "topic": {"type": "string", "enum": ["tech", "science"], "description": "what it is about"},
    },
    "required": ["founder"],
}


def gliner2_yaml(directory: Any, name: str, loadtime: dict | None = None, runtime: dict | None = None) -> Any:
    return parse_model_config({
        "sie_id": f"acme/gliner2-{name}", "weights_path": str(directory), "tasks": {"extract": {}},
        "max_sequence_length": 512,
        "profiles": {"default": {"adapter_path": "sie_server.adapters.gliner2.adapter:GLiNER2Adapter",
                                 "max_batch_tokens": 4096,
                                 "adapter_options": {"loadtime": loadtime or {}, "runtime": runtime or {}}}},
    })  # fmt: skip


@pytest.fixture(scope="module", params=COUNTING_LAYERS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, model_loader) -> tuple:
    directory = tmp_path_factory.mktemp(request.param)
    reference = save_gliner2(directory, counting_layer=request.param, seed=3)
    model = gliner2_yaml(directory / "gliner2", request.param)
    return reference, model_loader.load(model, "default", model.sie_id).adapter, directory


def reference_entities(reference: Any, text: str, labels: list[str], threshold: float) -> list[tuple]:
    """gliner2's entities flattened as the public adapter flattens them: by start, the span in the sentence end
    gliner2 added to a text without one left out."""
    found = reference.extract_entities(text, labels, threshold=threshold, include_confidence=True,
                                       include_spans=True)["entities"]  # fmt: skip
    flat = [(span["start"], min(span["end"], len(text)), label, span["confidence"])
            for label, spans in found.items() for span in spans if span["start"] < len(text)]  # fmt: skip
    return sorted(flat, key=lambda one: one[0])


def assert_entities(result: Any, expected: list[tuple], text: str) -> None:
    assert result.ok, result.error
    ours = result.result["entities"]
    assert [(e["start"], e["end"], e["label"]) for e in ours] == [x[:3] for x in expected]
    assert all(e["text"] == text[e["start"] : e["end"]] for e in ours)
    assert np.allclose([e["score"] for e in ours], [x[3] for x in expected], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("threshold", [0.01, 0.1, 0.8])
def test_entities_equal_gliner2(served: tuple, threshold: float) -> None:
    reference, adapter, _ = served
    results = adapter.extract(extract_items(TEXTS, LABELS, threshold=threshold)).items
    expected = [reference_entities(reference, text, LABELS, threshold) for text in TEXTS]
    assert threshold > 0.01 or all(expected), "the lowest threshold must find spans in every text"
    for text, result, theirs in zip(TEXTS, results, expected, strict=True):
        assert_entities(result, theirs, text)
        assert result.input_tokens > 0


def test_no_entities_where_the_count_head_sees_none(tmp_path, model_loader) -> None:
    reference = save_gliner2(tmp_path, count=0)
    model = gliner2_yaml(tmp_path / "gliner2", "none")
    adapter = model_loader.load(model, "default", model.sie_id).adapter
    results = adapter.extract(extract_items(TEXTS, LABELS, threshold=0.0)).items
    assert [reference_entities(reference, text, LABELS, 0.0) for text in TEXTS] == [[], [], []]
    assert [result.result["entities"] for result in results] == [[], [], []]


def test_rows_with_label_sets_of_their_own_batch_together(served: tuple) -> None:
    reference, adapter, _ = served
    label_sets = [["person"], ["award", "person", "city"], LABELS]
    results = adapter.extract(extract_items(TEXTS, label_sets, threshold=0.01)).items
    for text, labels, result in zip(TEXTS, label_sets, results, strict=True):
        assert_entities(result, reference_entities(reference, text, labels, 0.01), text)


@pytest.mark.parametrize("multi_label", [False, True])
def test_classifications_equal_gliner2(served: tuple, multi_label: bool) -> None:
    reference, adapter, _ = served
    labels, threshold = ["tech", "sport", "science", "politics"], 0.2
    items = extract_items(TEXTS, labels, classification_task="topic", multi_label=multi_label, threshold=threshold)
    for text, result in zip(TEXTS, adapter.extract(items).items, strict=True):
        tasks = {"topic": {"labels": labels, "multi_label": multi_label, "cls_threshold": threshold}}
        found = reference.classify_text(text, tasks, threshold=threshold, include_confidence=True)["topic"]
        found = [found] if isinstance(found, dict) else found
        expected = sorted([(one["label"], one["confidence"]) for one in found if one["confidence"] >= threshold],
                          key=lambda one: one[1], reverse=True)  # fmt: skip
        assert result.ok, result.error
        ours = result.result["classifications"]
        assert [c["label"] for c in ours] == [label for label, _ in expected]
        assert np.allclose([c["score"] for c in ours], [score for _, score in expected], atol=TOLERANCE, rtol=0)
        assert result.result["entities"] == []
    assert multi_label or len(ours) == 1


def every_span(text: str, widest: int = 4) -> list[dict[str, Any]]:
    """Every span of up to `widest` words of `text` as an entity, so the random model's best spans are named."""
    words = [(match.start(), match.end()) for match in re.finditer(r"\w+|[^\w\s]", text)]
    return [{"text": text[words[i][0] : words[j][1]], "label": "thing", "start": words[i][0], "end": words[j][1]}
            for i in range(len(words)) for j in range(i, min(i + widest, len(words)))]  # fmt: skip


def reference_relations(reference: Any, text: str, types: list[str], threshold: float) -> list[tuple]:
    """gliner2's relations kept as the public adapter keeps them: both ends among the named entities' texts, scored
    by the lower end; one per (type, head, tail) at its best, best first."""
    named = {entity["text"] for entity in every_span(text)}
    found = reference.extract_relations(text, types, threshold=threshold, include_confidence=True,
                                        include_spans=True)["relation_extraction"]  # fmt: skip
    best: dict[tuple, float] = {}
    for relation, instances in found.items():
        for one in instances:
            head, tail = one["head"], one["tail"]
            if head["text"] in named and tail["text"] in named:
                key = (relation, head["text"], tail["text"])
                best[key] = max(best.get(key, 0.0), min(head["confidence"], tail["confidence"]))
    return sorted(((*key, score) for key, score in best.items()), key=lambda x: (-x[3], x[0], x[1], x[2]))


@pytest.mark.parametrize("threshold", [0.01, 0.5])
def test_relations_between_named_entities_equal_gliner2(served: tuple, threshold: float) -> None:
    reference, adapter, _ = served
    types = ["founded", "located in", "won"]
    items = extract_items(TEXTS, types, threshold=threshold)
    for item, text in zip(items, TEXTS, strict=True):
        item.item["metadata"] = {"entities": every_span(text)}
    results = adapter.extract(items).items
    expected = [reference_relations(reference, text, types, threshold) for text in TEXTS]
    assert threshold > 0.01 or all(expected), "the lowest threshold must relate entities in every text"
    for text, result, theirs in zip(TEXTS, results, expected, strict=True):
        assert result.ok, result.error
        ours = result.result["relations"]
        assert [(r["relation"], r["head"], r["tail"]) for r in ours] == [x[:3] for x in theirs]
        assert np.allclose([r["score"] for r in ours], [x[3] for x in theirs], atol=TOLERANCE, rtol=0)
        assert [e["text"] for e in result.result["entities"]] == [e["text"] for e in every_span(text)]


def test_a_guard_classifies_with_its_load_time_task_and_labels(served: tuple, model_loader) -> None:
    reference, _, directory = served
    loadtime = {"classification_task": "prompt_safety", "default_labels": ["safe", "unsafe"], "multi_label": False,
                "positive_label": "unsafe"}  # fmt: skip
    model = gliner2_yaml(directory / "gliner2", "guard", loadtime)
    adapter = model_loader.load(model, "default", model.sie_id).adapter
    (result,) = adapter.extract(extract_items(TEXTS[:1], [], threshold=0.0)).items
    tasks = {"prompt_safety": {"labels": ["safe", "unsafe"], "multi_label": False, "cls_threshold": 0.0}}
    theirs = reference.classify_text(TEXTS[0], tasks, threshold=0.0, include_confidence=True)["prompt_safety"]
    (ours,) = result.result["classifications"]
    assert ours["label"] == theirs["label"] and abs(ours["score"] - theirs["confidence"]) <= TOLERANCE


def test_a_long_text_is_read_in_windows(served: tuple, model_loader) -> None:
    _, _, directory = served
    model = gliner2_yaml(directory / "gliner2", "short")
    model = parse_model_config({**model.raw, "max_sequence_length": 48})
    adapter = model_loader.load(model, "default", model.sie_id).adapter
    text = " ".join(TEXTS[:2] * 8)  # about 150 words, the model reads 48 tokens at once
    (entities,) = adapter.extract(extract_items([text], LABELS, threshold=0.01)).items
    spans = entities.result["entities"]
    assert spans and max(e["start"] for e in spans) > len(text) // 2, "later windows find spans too"
    assert all(e["text"] == text[e["start"] : e["end"]] for e in spans)
    (classified,) = adapter.extract(extract_items([text], ["tech", "sport"], classification_task="topic",
                                                  threshold=0.0)).items  # fmt: skip
    assert classified.ok and len(classified.result["classifications"]) == 1
    assert classified.input_tokens > 48


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"output_schema": {"type": "object"}, "labels": []}, "needs a non-empty 'properties' object"),
        ({"output_schema": SCHEMA}, "Field 'labels' does not apply with 'output_schema'"),
        ({"output_schema": {**SCHEMA, "properties": {"a|b": {"type": "string"}}}, "labels": []}, "property name"),
        ({"item": {"text": TEXTS[0], "metadata": {"entities": [{"start": 0, "end": 99}]}}}, "offsets must hold"),
        ({"options": {"top_k": 2}}, "Option 'top_k' does not apply to a GLiNER2"),
        ({"options": {"classification_task": " "}}, "Option 'classification_task' must be"),
        ({"labels": []}, "needs labels"),
        ({"options": {"classification_task": "t", "positive_label": "x"}}, "'positive_label' ('x') must be one of"),
    ],
)
def test_what_is_not_built_is_refused_per_item(served: tuple, change: dict, message: str) -> None:
    import attrs

    _, adapter, _ = served
    items = extract_items(TEXTS[:2], LABELS)
    refused, kept = adapter.extract([attrs.evolve(items[0], **change), items[1]]).items
    assert not refused.ok and message in refused.error
    assert kept.ok


def reference_specs(schema: dict) -> list[str]:
    """The schema's properties as the public adapter hands them to gliner2: the field specifications of one
    structure, `_sie_root` (`name::str`, `name::list`, `name::[a|b]::str`, `::description`)."""
    specs = []
    for name, definition in schema["properties"].items():
        if definition.get("enum"):
            spec = f"{name}::[{'|'.join(definition['enum'])}]::str"
        else:
            spec = f"{name}::str" if definition["type"] == "string" else f"{name}::list"
        description = definition.get("description") or definition.get("title")
        specs.append(f"{spec}::{description}" if description else spec)
    return specs


def reference_data(reference: Any, text: str, schema: dict, threshold: float) -> dict[str, Any]:
    """gliner2's structured extraction as the public adapter asks for it, and its first instance ({} when none)."""
    (found,) = reference.batch_extract_json([text], {"_sie_root": reference_specs(schema)}, threshold=threshold)
    return found["_sie_root"][0] if found["_sie_root"] else {}


def test_a_structure_row_reads_the_words_gliner2s_processor_builds(served: tuple) -> None:
    """The words a structure row reads — its schema before [SEP_TEXT], the enum prefix and the text's words after —
    are those gliner2's processor builds for the public adapter's field specifications (a second check beside the
    equal answers: a prompt word that changes no discrete answer of a random model still shows here)."""
    import attrs

    from sie.worker.adapters.gliner2 import Settings, row_prefix

    reference, adapter, _ = served
    (item,) = extract_items(TEXTS[:1], [])
    request = adapter._structure_request(attrs.evolve(item, output_schema=SCHEMA), Settings())
    record = reference.processor.transform_record(
        TEXTS[0], reference._json_schema({"_sie_root": reference_specs(SCHEMA)})
    )
    words, _ = row_prefix(request.schemas)
    assert words == [*record.schema_tokens_list[0], "[SEP_TEXT]"]
    assert [*request.lead, *(word.text for word in request.words)] == record.text_tokens


@pytest.mark.parametrize("threshold", [0.01, 0.4, 0.7])
def test_structured_extraction_equals_gliner2(served: tuple, threshold: float) -> None:
    """An output_schema's string, array and enum properties (a multi-word value, descriptions and a title in the
    prompt) filled as gliner2 fills them: the same values, null and [] where a field found nothing."""
    import attrs

    reference, adapter, _ = served
    items = [attrs.evolve(item, output_schema=SCHEMA) for item in extract_items(TEXTS, [], threshold=threshold)]
    results = adapter.extract(items).items
    expected = [reference_data(reference, text, SCHEMA, threshold) for text in TEXTS]
    assert threshold > 0.01 or all(one.get("founder") and one.get("tone") for one in expected), expected
    assert threshold < 0.7 or any(one.get("places") == [] or one.get("founder") is None for one in expected)
    for result, theirs in zip(results, expected, strict=True):
        assert result.ok, result.error
        assert result.result["data"] == theirs and result.result["entities"] == []
        assert list(result.result["data"]) in ([], list(SCHEMA["properties"]))


def test_a_structure_of_several_instances_answers_the_first(tmp_path, model_loader) -> None:
    """A count head that sees two instances: gliner2 returns both, a flat object is the first."""
    import attrs

    reference = save_gliner2(tmp_path, count=2, seed=5)
    model = gliner2_yaml(tmp_path / "gliner2", "two")
    adapter = model_loader.load(model, "default", model.sie_id).adapter
    strings = {"type": "array", "items": {"type": "string"}}
    schema = {"type": "object", "properties": {"who": {"type": "string"}, "what": strings}}
    items = [attrs.evolve(item, output_schema=schema) for item in extract_items(TEXTS, [], threshold=0.01)]
    for text, result in zip(TEXTS, adapter.extract(items).items, strict=True):
        (found,) = reference.batch_extract_json([text], {"_sie_root": ["who::str", "what::list"]}, threshold=0.01)
        assert len(found["_sie_root"]) == 2
        assert result.ok and result.result["data"] == found["_sie_root"][0]


def test_structures_batch_with_entities_and_read_long_texts_in_windows(served: tuple, model_loader) -> None:
    import attrs

    reference, adapter, directory = served
    entities, structured = extract_items(TEXTS[:2], LABELS, threshold=0.01)
    structured = attrs.evolve(structured, labels=[], output_schema=SCHEMA)
    first, second = adapter.extract([entities, structured]).items
    assert_entities(first, reference_entities(reference, TEXTS[0], LABELS, 0.01), TEXTS[0])
    assert second.result["data"] == reference_data(reference, TEXTS[1], SCHEMA, 0.01)
    model = parse_model_config({**gliner2_yaml(directory / "gliner2", "short").raw, "max_sequence_length": 256})
    short = model_loader.load(model, "default", model.sie_id).adapter
    text = " ".join(TEXTS[:2] * 12)  # the schema takes ~170 tokens of the 256: windows of ~80
    (item,) = extract_items([text], [], threshold=0.01)
    (result,) = short.extract([attrs.evolve(item, output_schema=SCHEMA)]).items
    assert result.ok, result.error
    assert result.input_tokens > 2 * 256
    data = result.result["data"]
    assert data["tone"] in SCHEMA["properties"]["tone"]["enum"] and isinstance(data["places"], list)
    assert all(place in text.lower() + "." for place in (p.lower() for p in data["places"]))


def test_a_boundary_checkpoint_fails_its_load_naming_it(served: tuple, model_loader, tmp_path) -> None:
    import json
    import shutil

    _, _, directory = served
    shutil.copytree(directory / "gliner2", tmp_path / "boundary")
    config = json.loads((tmp_path / "boundary" / "config.json").read_text())
    (tmp_path / "boundary" / "config.json").write_text(json.dumps(config | {"architecture": "boundary"}))
    model = gliner2_yaml(tmp_path / "boundary", "boundary")
    with pytest.raises(ModelLoadError, match="a GLiNER2.5 boundary checkpoint, which SIE does not build"):
        model_loader.load(model, "default", model.sie_id)
