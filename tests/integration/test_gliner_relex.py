"""GLiNER relation-extraction models ("relex") served through the worker against the `gliner` package on the same tiny
random checkpoints, one per relations layer gliner has: the same entities and the same relations (head, tail, type),
scores within 1e-4, across thresholds, flat and nested spans, one or several labels per span, rows of one batch with
label and relation sets of their own (and rows asking for no relations); a text longer than the model reads at once
has the relations gliner finds in each of its windows, each once at its best score; the entity candidates are capped
per row and what cannot run is refused per item."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sie.catalog import parse_model_config
from sie.worker.adapters.gliner_relations import ADJACENCY_FLOOR, MAX_CANDIDATES
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.gliner import convert_gliner, load_gliner_config
from sie.worker.convert.gliner_relations import RELATIONS_LAYERS
from sie.worker.convert.names import (
    ADJACENCY_THRESHOLDS,
    ENTITY_MASK,
    ENTITY_SPANS,
    PAIR_INDEX,
    RELATION_EMBEDDINGS,
    RELATION_SCORES,
    WORD_EMBEDDINGS,
    relations_graph_path,
)
from sie.worker.spans import plan_windows, split_words
from support.worker_items import extract_items
from support.zero_shot_checkpoints import save_gliner

TOLERANCE = 1e-4
TEXTS = [
    "Steve Jobs founded Apple in Cupertino California in 1976.",
    "Marie Curie won the Nobel Prize in Physics and Chemistry.",
    "Barack Obama was born in Honolulu, Hawaii.",
]
LABELS = ["person", "organization", "city", "award"]
RELATIONS = ["founded", "located in", "born in"]
# The relations layers served end to end: those whose adjacency puts some pairs of these random checkpoints' entities
# above gliner's floor of 0.5 and some below (attention weights spread over the candidates, and the GCN's
# sigmoid(P Pᵀ) sits on one side; every layer is compared on its own below, at thresholds that split its pairs).
SERVED_LAYERS = ("dot", "gat", "none")


@pytest.fixture(scope="module", params=SERVED_LAYERS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, model_loader) -> tuple[Any, Any]:
    directory = tmp_path_factory.mktemp(f"relex-{request.param}")
    reference = save_gliner(directory, relations_layer=request.param)
    return reference, _load(model_loader, directory, request.param)


def _load(model_loader, directory: Path, name: str) -> Any:
    model = parse_model_config({
        "sie_id": f"acme/gliner-relex-{name}", "weights_path": str(directory / "gliner"), "tasks": {"extract": {}},
        "profiles": {"default": {"adapter_path": "sie_server.adapters.gliner:GLiNERAdapter",
                                 "max_batch_tokens": 4096}},
    })  # fmt: skip
    return model_loader.load(model, "default", model.sie_id).adapter


def _expected(reference: Any, texts: list[str], labels: list[str], relations: list[str], threshold: float,
              relation_threshold: float, **options: Any) -> tuple[list, list]:  # fmt: skip
    """gliner's entities and relations, its adjacency threshold the entity threshold at gliner's floor or above (as
    the public server sets it)."""
    return reference.inference(
        texts, labels, relations=relations, threshold=threshold, adjacency_threshold=max(threshold, ADJACENCY_FLOOR),
        relation_threshold=relation_threshold, return_relations=True, **options,
    )  # fmt: skip


def _relations(found: list[dict]) -> dict[tuple[str, str, str], float]:
    keyed = {}
    for relation in found:
        head, tail = relation["head"], relation["tail"]
        key = (head if isinstance(head, str) else head["text"], tail if isinstance(tail, str) else tail["text"],
               relation["relation"])  # fmt: skip
        keyed[key] = max(keyed.get(key, 0.0), relation["score"])
    return keyed


def assert_same_relations(ours: list[dict], theirs: list[dict]) -> None:
    mine, expected = _relations(ours), _relations(theirs)
    assert len(ours) == len(theirs) and mine.keys() == expected.keys()
    assert np.allclose([mine[key] for key in expected], list(expected.values()), atol=TOLERANCE, rtol=0)
    scores = [relation["score"] for relation in ours]
    assert scores == sorted(scores, reverse=True), "best first"


def assert_same_entities(ours: list[dict], theirs: list[dict]) -> None:
    assert [(e["start"], e["end"], e["label"]) for e in ours] == [(e["start"], e["end"], e["label"]) for e in theirs]
    assert np.allclose([e["score"] for e in ours], [e["score"] for e in theirs], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize(("threshold", "relation_threshold"), [(0.3, 0.5), (0.32, 0.55)])
@pytest.mark.parametrize(("flat_ner", "multi_label"), [(True, False), (False, True)])
def test_entities_and_relations_equal_gliner(
    served: tuple[Any, Any], threshold: float, relation_threshold: float, flat_ner: bool, multi_label: bool
) -> None:
    reference, adapter = served
    options = {"flat_ner": flat_ner, "multi_label": multi_label}
    results = adapter.extract(extract_items(TEXTS, LABELS, threshold=threshold, relation_labels=RELATIONS,
                                            relation_threshold=relation_threshold, **options)).items  # fmt: skip
    entities, relations = _expected(reference, TEXTS, LABELS, RELATIONS, threshold, relation_threshold, **options)
    assert any(relations), "the thresholds must find relations"
    for result, their_entities, their_relations in zip(results, entities, relations, strict=True):
        assert result.ok, result.error
        assert_same_entities(result.result["entities"], their_entities)
        assert_same_relations(result.result["relations"], their_relations)


def test_rows_with_label_and_relation_sets_of_their_own_batch_together(served: tuple[Any, Any]) -> None:
    reference, adapter = served
    label_sets = [["person", "organization"], LABELS, ["city", "person"]]
    relation_sets = [["founded"], [], ["born in", "located in", "founded"]]
    items = [item for text, labels, relations in zip(TEXTS, label_sets, relation_sets, strict=True)
             for item in extract_items([text], labels, threshold=0.3, relation_labels=relations or None)]  # fmt: skip
    results = adapter.extract(items).items
    for text, labels, relations, result in zip(TEXTS, label_sets, relation_sets, results, strict=True):
        ((their_entities,), (their_relations,)) = _expected(reference, [text], labels, relations, 0.3, 0.3)
        assert_same_entities(result.result["entities"], their_entities)
        assert_same_relations(result.result["relations"], their_relations)
    assert results[1].result["relations"] == []


def test_a_long_text_has_each_windows_relations_once_at_their_best(served: tuple[Any, Any]) -> None:
    reference, adapter = served
    text = " ".join(TEXTS * 5)  # 135 words, the model reads 64 at once
    options = {"threshold": 0.33, "relation_labels": RELATIONS, "relation_threshold": 0.4}  # under 100 candidates
    (result,) = adapter.extract(extract_items([text], LABELS, **options)).items
    words = split_words(text)
    (counts,) = adapter.tokenizer.word_token_counts([[word.text for word in words]])
    (prompt,) = adapter.tokenizer.encode_words([adapter._prompt(LABELS, RELATIONS)])
    windows = plan_windows(counts, adapter.settings.max_len, adapter.tokenizer.max_length - len(prompt),
                           adapter.overlap)  # fmt: skip
    assert len(windows) > 1
    expected: list[dict] = []
    for window in windows:
        window_text = text[words[window.start].start : words[window.stop - 1].end]
        expected += _expected(reference, [window_text], LABELS, RELATIONS, 0.33, 0.4)[1][0]
    best = _relations(expected)
    assert best, "the windows must find relations"
    ours = _relations(result.result["relations"])
    assert len(result.result["relations"]) == len(ours) == len(best) and ours.keys() == best.keys()
    assert np.allclose([ours[key] for key in best], list(best.values()), atol=TOLERANCE, rtol=0)


def test_entity_candidates_are_capped_per_row(served: tuple[Any, Any]) -> None:
    """At threshold 0 every span is a candidate: the first MAX_CANDIDATES (in span order) are paired. A pair's
    adjacency under `dot` is its own, and every pair is kept without one, so each relation found is gliner's."""
    reference, adapter = served
    text = " ".join(TEXTS)  # 33 words, spans of up to 4: 126 of them
    options = {"threshold": 0.0, "relation_labels": RELATIONS, "relation_threshold": 0.52, "flat_ner": False,
               "multi_label": True}  # fmt: skip
    (result,) = adapter.extract(extract_items([text], LABELS, **options)).items
    assert len(split_words(text)) * 4 - 6 > MAX_CANDIDATES
    assert result.ok
    if adapter.model.sie_id.rsplit("-", 1)[1] in ("dot", "none"):
        (theirs,) = _expected(reference, [text], LABELS, RELATIONS, 0.0, 0.52, flat_ner=False, multi_label=True)[1]
        scored: dict[tuple[str, str, str], list[float]] = {}  # one text may be several spans' ("in")
        for relation in theirs:
            scored.setdefault((relation["head"]["text"], relation["tail"]["text"], relation["relation"]),
                              []).append(relation["score"])  # fmt: skip
        found = result.result["relations"]
        assert found and len(found) < len(theirs)
        for relation in found:
            scores = scored[relation["head"], relation["tail"], relation["relation"]]
            assert min(abs(score - relation["score"]) for score in scores) <= TOLERANCE


def test_bad_relation_options_are_refused_per_item(served: tuple[Any, Any]) -> None:
    _, adapter = served
    items = [
        *extract_items([TEXTS[0]], LABELS, relation_labels=["founded", ""]),
        *extract_items([TEXTS[0]], LABELS, relation_labels=RELATIONS, relation_threshold=1.5),
        *extract_items([TEXTS[0]], LABELS, relation_labels=[f"relation type {index}" for index in range(101)]),
        *extract_items([TEXTS[0]], LABELS, relation_labels=[f"relation type {index}" for index in range(60)]),
        *extract_items([TEXTS[1]], LABELS, relation_labels=RELATIONS, threshold=0.3),
    ]
    results = adapter.extract(items).items
    assert [result.error_code for result in results[:4]] == ["INVALID_INPUT"] * 4
    assert "relation_labels" in results[0].error and "relation_threshold" in results[1].error
    assert "relation_labels" in results[2].error and "leave none for the text" in results[3].error
    assert results[4].ok and results[4].result["relations"]


def test_a_triples_layer_is_refused_naming_it(tmp_path: Path) -> None:
    save_gliner(tmp_path, relations_layer="dot", triples_layer="TransE")
    with pytest.raises(ConversionError, match="triples_layer 'TransE'"):
        load_gliner_config(tmp_path / "gliner")


@pytest.mark.parametrize("layer", RELATIONS_LAYERS)
def test_the_relation_graph_equals_gliner_for_every_relations_layer(layer: str, tmp_path: Path) -> None:
    """The relation graph on random word embeddings, candidates and relation types against the checkpoint's own
    layers (its span layer, relations layer, gliner's pair building, its pair layer): the same pairs kept at a
    threshold that keeps about half of them, scored alike."""
    import onnxruntime
    import torch
    from gliner.modeling.utils import build_all_entity_pairs, build_entity_pairs

    reference = save_gliner(tmp_path, relations_layer=layer).model
    convert_gliner(tmp_path / "gliner", tmp_path / "span.onnx")
    session = onnxruntime.InferenceSession(str(relations_graph_path(tmp_path / "span.onnx")))
    rng = np.random.default_rng(7)
    words = rng.standard_normal((2, 10, 24)).astype(np.float32)
    types = rng.standard_normal((2, 3, 24)).astype(np.float32)
    candidates = [[(0, 0), (1, 3), (4, 4), (5, 8), (9, 9)], [(2, 2), (3, 5), (7, 7)]]
    spans = np.zeros((2, 5, 2), dtype=np.int64)
    mask = np.zeros((2, 5), dtype=np.float32)
    for row, found in enumerate(candidates):
        spans[row, : len(found)], mask[row, : len(found)] = found, 1.0
    with torch.no_grad():
        marker = reference.span_rep_layer.span_rep_layer
        h, index = torch.from_numpy(words), torch.arange(2)[:, None]
        starts = marker.project_start(h)[index, torch.from_numpy(spans[..., 0])]
        ends = marker.project_end(h)[index, torch.from_numpy(spans[..., 1])]
        entities = marker.out_project(torch.cat([starts, ends], dim=-1).relu())
        entity_mask = torch.from_numpy(mask)
        if layer == "none":
            threshold = 0.0
            pairs, valid, heads, tails = build_all_entity_pairs(entities, entity_mask)
        else:
            adjacency = reference.relations_rep_layer(entities, entity_mask)
            off_diagonal = (entity_mask[:, :, None] * entity_mask[:, None, :]) * (1 - torch.eye(5))
            threshold = _splitting(adjacency[off_diagonal.bool()].numpy())
            pairs, valid, heads, tails = build_entity_pairs(adjacency, entities, threshold=threshold)
        logits = torch.einsum("BND,BCD->BNC", reference.pair_rep_layer(torch.cat([heads, tails], dim=-1)),
                              torch.from_numpy(types))  # fmt: skip
        expected = {(row, *pairs[row, n].tolist()): torch.sigmoid(logits[row, n]).numpy()
                    for row in range(2) for n in range(pairs.shape[1]) if valid[row, n]}  # fmt: skip
    found, scores = session.run([PAIR_INDEX, RELATION_SCORES], {
        WORD_EMBEDDINGS: words, ENTITY_SPANS: spans, ENTITY_MASK: mask, RELATION_EMBEDDINGS: types,
        ADJACENCY_THRESHOLDS: np.array([threshold, threshold], dtype=np.float32),
    })  # fmt: skip
    assert 0 < len(expected) <= 20 + 6
    assert [tuple(pair) for pair in found.tolist()] == sorted(expected), "the same pairs, in gliner's order"
    assert np.allclose(scores, np.stack([expected[tuple(pair)] for pair in found.tolist()]), atol=TOLERANCE, rtol=0)


def _splitting(values: np.ndarray) -> float:
    """A threshold keeping some of `values` and not others (about half where they spread), halfway between two of them
    far enough apart that float rounding cannot put one on the other side."""
    ordered = np.unique(values)
    gaps = [index for index in range(len(ordered) - 1) if ordered[index + 1] - ordered[index] > 1e-4]
    assert gaps, f"no gap in {ordered}"
    index = min(gaps, key=lambda gap: abs(gap - len(ordered) // 2))
    return float(ordered[index] + ordered[index + 1]) / 2
