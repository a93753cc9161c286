"""GLiREL relation extraction served through the worker against the `glirel` package on the same tiny random
checkpoints (DeBERTa-v2 and BERT backbones; both span markers; the dot, normalised, thresholded and concatenating
scorers; relation types read at their marker, their label or both; a pair distance limit): the same relations
between the same entities, best first, scores within 1e-4, across thresholds and top_k; entities past the words the
model reads take no part; and what cannot run (no entities, bad offsets, too many) is refused per item."""

from __future__ import annotations

import shutil
from typing import Any

import attrs
import numpy as np
import pytest

from sie.catalog import parse_model_config
from sie.catalog.options import MAX_ENTITIES
from sie.wire.ipc_batch import ExtractBatchItem
from sie.worker.adapters import glirel
from sie.worker.adapters.glirel import entity_pairs
from sie.worker.spans import split_words
from support.zero_shot_checkpoints import save_glirel

TOLERANCE = 1e-4
RELATIONS = ["founded by", "located in", "born in", "won"]
# Each text with the entities it names (distinct texts, so a relation's head and tail say which entities they are).
EXAMPLES = [
    ("Steve Jobs founded Apple in Cupertino, California in 1976.", ["Steve Jobs", "Apple", "Cupertino", "1976"]),
    ("Marie Curie won the Nobel Prize in Physics.", ["Marie Curie", "Nobel Prize", "Physics"]),
    ("Barack Obama was born in Honolulu, Hawaii.", ["Barack Obama", "Honolulu", "Hawaii"]),
]
VARIANTS = {
    "deberta-markerv1-dot": {},
    "deberta-markerv2-dot_norm-both": {"span_marker_mode": "markerv2", "scorer": "dot_norm",
                                       "label_embed_strategy": "both"},
    "bert-dot_thresh-label-distance": {"backbone": "bert", "hidden_size": 32, "scorer": "dot_thresh",
                                       "label_embed_strategy": "label", "max_entity_pair_distance": 4},
    "deberta-concat_proj": {"scorer": "concat_proj"},
}  # fmt: skip


def entities_of(text: str, names: list[str]) -> list[dict[str, Any]]:
    entities = []
    for name in names:
        start = text.index(name)
        entities.append({"text": name, "label": "thing", "start": start, "end": start + len(name)})
    return entities


def glirel_ner(text: str, entities: list[dict[str, Any]]) -> list[list[Any]]:
    """The entities as glirel takes them: first and last word (inclusive), label, text."""
    words = split_words(text)
    ner = []
    for entity in entities:
        covered = [i for i, word in enumerate(words) if word.end > entity["start"] and word.start < entity["end"]]
        ner.append([covered[0], covered[-1], entity["label"], entity["text"]])
    return ner


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, model_loader) -> tuple[Any, Any]:
    directory = tmp_path_factory.mktemp(request.param)
    reference = save_glirel(directory, **VARIANTS[request.param])
    # A GLiREL checkpoint saves neither its backbone's config nor its tokenizer: they are put beside it.
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(directory / "backbone" / name, directory / "glirel" / name)
    model = parse_model_config({
        "sie_id": f"acme/glirel-{request.param}", "weights_path": str(directory / "glirel"),
        "tasks": {"extract": {}},
        "profiles": {"default": {"adapter_path": "sie_server.adapters.glirel:GLiRELAdapter",
                                 "max_batch_tokens": 4096}},
    })  # fmt: skip
    return reference, model_loader.load(model, "default", model.sie_id).adapter


def extract_items(examples: list[tuple[str, list[dict]]], labels: list[str], **options: Any) -> list[ExtractBatchItem]:
    return [
        ExtractBatchItem(
            work_item_id=f"x.{index}", request_id="x", item_index=index, total_items=len(examples), timestamp=0.0,
            item={"text": text, "metadata": {"entities": entities}}, labels=list(labels), options=options or None,
        )
        for index, (text, entities) in enumerate(examples)
    ]  # fmt: skip


def reference_relations(reference: Any, text: str, entities: list[dict], labels: list[str], **options: Any) -> list:
    words = [word.text for word in split_words(text)]
    found = reference.predict_relations(words, labels, threshold=options["threshold"],
                                        ner=glirel_ner(text, entities), top_k=options["top_k"])  # fmt: skip
    return [(" ".join(r["head_text"]), " ".join(r["tail_text"]), r["label"], r["score"]) for r in found]


def tokens_text(name: str) -> str:
    return " ".join(word.text for word in split_words(name))


@pytest.mark.parametrize(("threshold", "top_k"), [(0.3, 10), (0.5, 1), (0.7, 2)])
def test_relations_equal_glirel(served: tuple[Any, Any], threshold: float, top_k: int) -> None:
    reference, adapter = served
    examples = [(text, entities_of(text, names)) for text, names in EXAMPLES]
    results = adapter.extract(extract_items(examples, RELATIONS, threshold=threshold, top_k=top_k)).items
    found_any = False
    for result, (text, entities) in zip(results, examples, strict=True):
        assert result.ok, result.error
        theirs = reference_relations(reference, text, entities, RELATIONS, threshold=threshold, top_k=top_k)
        ours = result.result["relations"]
        found_any = found_any or bool(theirs)
        # glirel names an entity by its words joined with spaces; ours by the text the caller sent. Best first;
        # scores that round to the same float32 may come in either order.
        mine = {(tokens_text(r["head"]), tokens_text(r["tail"]), r["relation"]): r["score"] for r in ours}
        assert len(mine) == len(ours) and sorted(mine) == sorted((h, t, rel) for h, t, rel, _ in theirs)
        assert all(np.isclose(mine[h, t, rel], score, atol=TOLERANCE, rtol=0) for h, t, rel, score in theirs)
        assert [r["score"] for r in ours] == sorted((r["score"] for r in ours), reverse=True)
        assert result.result["entities"] == [{**entity, "score": 1.0, "bbox": None} for entity in entities]
        assert result.input_tokens > 0
    assert found_any, "the thresholds must find relations"


def test_rows_with_their_own_relation_types_batch_together(served: tuple[Any, Any]) -> None:
    reference, adapter = served
    text, names = EXAMPLES[0]
    entities = entities_of(text, names)
    label_sets = [RELATIONS[:2], RELATIONS[1:], ["founded by", "founded by", "won"]]
    items = [item for labels in label_sets for item in extract_items([(text, entities)], labels, threshold=0.3)]
    results = adapter.extract(items).items
    for result, labels in zip(results, label_sets, strict=True):
        distinct = list(dict.fromkeys(labels))
        theirs = reference_relations(reference, text, entities, distinct, threshold=0.3, top_k=10)
        assert [(r["relation"], round(r["score"], 4)) for r in result.result["relations"]] == [
            (relation, round(score, 4)) for _, _, relation, score in theirs
        ]


def test_entities_past_the_words_read_take_no_part(served: tuple[Any, Any]) -> None:
    """max_len is 64 words: an entity after them is echoed but in no relation (glirel truncates the text there)."""
    reference, adapter = served
    text = "Steve Jobs founded Apple in Cupertino. " + "filler " * 70 + "Paris"
    entities = entities_of(text, ["Steve Jobs", "Apple", "Cupertino", "Paris"])
    (result,) = adapter.extract(extract_items([(text, entities)], RELATIONS, threshold=0.0)).items
    assert result.ok, result.error
    named = {r["head"] for r in result.result["relations"]} | {r["tail"] for r in result.result["relations"]}
    assert named == {"Steve Jobs", "Apple", "Cupertino"}
    assert len(result.result["entities"]) == 4
    short = text[: text.index("filler")]
    theirs = reference_relations(reference, short, entities[:3], RELATIONS, threshold=0.0, top_k=10)
    assert len(result.result["relations"]) == len(theirs)


def test_an_item_it_cannot_read_is_refused_alone(served: tuple[Any, Any]) -> None:
    _, adapter = served
    text, names = EXAMPLES[1]
    good = entities_of(text, names)
    cases = [
        [],
        [{"start": 0, "end": 500}],
        [{"start": 5, "end": 2}],
        [{"start": "0", "end": 4}],
        [{"start": 11, "end": 12}],  # a space
        [{"start": 0, "end": 1}] * (MAX_ENTITIES + 1),
        "Marie",
    ]
    examples = [(text, good)] + [(text, case) for case in cases]
    results = adapter.extract(extract_items(examples, RELATIONS)).items
    assert results[0].ok
    for result in results[1:]:
        assert not result.ok and result.error_code == "INVALID_INPUT", result
    assert "non-empty list" in results[1].error and "0 <= start < end" in results[2].error
    assert f"at most {MAX_ENTITIES}" in results[6].error
    (one,) = adapter.extract(extract_items([(text, good[:1])], RELATIONS)).items
    assert one.ok and one.result["relations"] == [] and len(one.result["entities"]) == 1
    (missing,) = adapter.extract(extract_items([(text, good)], [])).items
    assert not missing.ok and "labels" in missing.error


def test_entity_pairs_follow_glirel() -> None:
    spans = [(0, 1), (3, 3), (9, 10)]
    assert entity_pairs(spans, None) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    # beyond the distance only i < j is kept (glirel's coreference pairs are one-sided and always kept)
    assert entity_pairs(spans, 3) == [(0, 1), (0, 2), (1, 0), (1, 2)]


def test_pairs_split_across_graph_runs_score_the_same(served: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Many entities' pairs run in parts (PAIR_BUDGET), each part reading its text again: the same relations."""
    _, adapter = served
    examples = [(text, entities_of(text, names)) for text, names in EXAMPLES]
    items = extract_items(examples, RELATIONS, threshold=0.0)
    whole = [result.result for result in adapter.extract(items).items]
    monkeypatch.setattr(glirel, "PAIR_BUDGET", 3)
    parts = [result.result for result in adapter.extract(items).items]
    for ours, expected in zip(parts, whole, strict=True):
        assert [(r["head"], r["tail"], r["relation"]) for r in ours["relations"]] == [
            (r["head"], r["tail"], r["relation"]) for r in expected["relations"]
        ]
        assert np.allclose([r["score"] for r in ours["relations"]], [r["score"] for r in expected["relations"]],
                           atol=1e-6, rtol=0)  # fmt: skip


def test_pair_runs_bound_what_one_run_holds() -> None:
    row = glirel._Row(
        0, None, [], [[0]], [(0, 0)] * 4, [0, 1, 2, 3], [(i, j) for i in range(4) for j in range(4) if i != j]
    )
    other = attrs.evolve(row, item=1, pairs=[(0, 1), (1, 0)])
    runs = glirel.pair_runs([row, other], lambda r: 2, 8)
    assert [[len(part.pairs) for part in run] for run in runs] == [[4], [4], [4], [2]]
    assert [pair for run in runs for part in run if part.item == 0 for pair in part.pairs] == row.pairs
    assert [len(run) for run in glirel.pair_runs([other, attrs.evolve(other, item=2)], lambda r: 2, 8)] == [2]
    assert glirel.pair_runs([attrs.evolve(row, pairs=[])], lambda r: 1, 8) == []
    assert [len(run) for run in glirel.pair_runs([row], lambda r: 100, 8)] == [1] * 12  # one pair a run at least
