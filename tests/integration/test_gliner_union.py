"""A GLiNER union (the public `superlinked/pii-redact` YAML's shape: the model's own span checkpoint and a token-level
member fetched from the Hub cache at a pinned revision) served through the worker, against the `gliner` package
running each member on each word window, composed as SIE's PII redaction study composes them: spans under the score
floor dropped, one span per (start, end, label) at its best score, and the propagated names of the `person` spans."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sie.catalog import parse_model_config
from sie.worker.artifacts import ArtifactResolver
from sie.worker.errors import ModelLoadError
from sie.worker.loading import ModelLoader
from sie.worker.session import SessionOptions
from sie.worker.spans import split_words
from support.gliner_union import reference_union, seed_hub_snapshot
from support.worker_items import extract_items
from support.zero_shot_checkpoints import save_gliner

MEMBER = "acme/token-gliner"
REVISION = "c90187673f464518dca09f41689184ed6976242c"
TOLERANCE = 1e-4
LABELS = ["person", "city", "organization"]
TEXTS = [
    "Steve Jobs met Tim Cook in Cupertino. Later Jobs and Cook walked to Apple with Laurene Powell Jobs and Cook "
    "again, and Tim Cook spoke of Jobs in Cupertino and Palo Alto.",
    "Marie Curie won the Nobel Prize.",
]
MEMBER_OPTIONS = {"threshold": 0.45, "merge_adjacent_entities": True}
COMPOSITION = {"score_floor": 0.47, "window_words": 12, "window_overlap": 3, "propagate_label": "person",
               "name_min_letters": 3, "default_labels": LABELS}  # fmt: skip


def union_config(primary: Path, members: list[dict[str, Any]], runtime: dict[str, Any]) -> Any:
    return parse_model_config({
        "sie_id": "acme/pii-union", "weights_path": str(primary), "tasks": {"extract": {}},
        "profiles": {"default": {
            "adapter_path": "sie_server.adapters.gliner_union.adapter:GLiNERUnionAdapter", "max_batch_tokens": 4096,
            "adapter_options": {"loadtime": {"members": members}, "runtime": runtime},
        }},
    })  # fmt: skip


@pytest.fixture(scope="module")
def union(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Any], Any, ModelLoader, Path]:
    directory = tmp_path_factory.mktemp("union")
    primary = save_gliner(directory / "primary", backbone="deberta-v2", seed=5)
    member = save_gliner(directory / "member", backbone="deberta-v2", span_mode="token_level", seed=7)
    seed_hub_snapshot(directory / "cache", MEMBER, REVISION, directory / "member" / "gliner")
    loader = ModelLoader(ArtifactResolver(directory / "cache", hf_offline=True), directory / "cache" / "converted",
                         SessionOptions(intra_op_threads=1))  # fmt: skip
    members = [{"model": MEMBER, "revision": REVISION, "options": MEMBER_OPTIONS}]
    model = union_config(directory / "primary" / "gliner", members, COMPOSITION)
    return (
        [(primary, {}), (member, MEMBER_OPTIONS)],
        loader.load(model, "default", model.sie_id).adapter,
        loader,
        directory,
    )


def assert_union(result: Any, expected: list[tuple], text: str) -> None:
    assert result.ok, result.error
    entities = result.result["entities"]
    assert [(e["start"], e["end"], e["label"]) for e in entities] == [x[:3] for x in expected]
    assert all(e["text"] == text[e["start"] : e["end"]] for e in entities)
    assert np.allclose([e["score"] for e in entities], [x[3] for x in expected], atol=TOLERANCE, rtol=0)


def test_the_union_equals_the_study_composition_of_gliners_spans(union: tuple) -> None:
    models, adapter, _, _ = union
    assert len(split_words(TEXTS[0])) > 2 * COMPOSITION["window_words"], "the long text needs several windows"
    results = adapter.extract(extract_items(TEXTS, LABELS)).items
    for text, result in zip(TEXTS, results, strict=True):
        expected = reference_union(models, text, LABELS, COMPOSITION)
        assert_union(result, expected, text)
        assert result.input_tokens > 0
    # The own checkpoint finds the organizations here, the member the people and cities.
    assert {x[2] for x in reference_union(models, TEXTS[0], LABELS, COMPOSITION)} == set(LABELS)


def test_names_of_person_spans_are_found_again_where_they_recur(union: tuple) -> None:
    models, adapter, _, _ = union
    composition = COMPOSITION | {"score_floor": 0.55}  # above the wide merged spans that cover most of the text
    (result,) = adapter.extract(extract_items(TEXTS[:1], LABELS, score_floor=0.55)).items
    expected = reference_union(models, TEXTS[0], LABELS, composition)
    assert_union(result, expected, TEXTS[0])
    unpropagated = reference_union(models, TEXTS[0], LABELS, composition | {"propagate_label": None})
    assert len(expected) > len(unpropagated), "names must be found again in this text"


def test_request_options_change_the_composition_and_default_labels_stand_in(union: tuple) -> None:
    models, adapter, _, _ = union
    options = {"score_floor": 0.5, "window_words": 20, "window_overlap": 5, "propagate_label": ""}
    (result,) = adapter.extract(extract_items(TEXTS[:1], ["person", "city"], **options)).items
    assert_union(
        result,
        reference_union(models, TEXTS[0], ["person", "city"], COMPOSITION | options),
        TEXTS[0],
    )
    # No labels: the profile's default labels, or the request's own.
    (result,) = adapter.extract(extract_items(TEXTS[:1], [])).items
    assert_union(
        result,
        reference_union(models, TEXTS[0], LABELS, COMPOSITION),
        TEXTS[0],
    )
    (result,) = adapter.extract(extract_items(TEXTS[:1], [], default_labels=["city"])).items
    assert_union(
        result,
        reference_union(models, TEXTS[0], ["city"], COMPOSITION),
        TEXTS[0],
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"window_words": 10, "window_overlap": 10}, "'window_overlap' (10) must be less than 'window_words' (10)"),
        ({"score_floor": 2}, "Option 'score_floor' must be a number from 0 to 1"),
        ({"threshold": 0.2}, "Option 'threshold' does not apply to a union of zero-shot entity extraction models"),
    ],
)
def test_a_bad_option_fails_its_item_only(union: tuple, options: dict, message: str) -> None:
    _, adapter, _, _ = union
    items = extract_items(TEXTS, LABELS)
    bad = extract_items(TEXTS[:1], LABELS, **options)[0]
    refused, served = adapter.extract([bad, items[1]]).items
    assert not refused.ok and message in refused.error
    assert served.ok


def test_no_labels_anywhere_is_refused_naming_the_option(union: tuple) -> None:
    models, _, loader, directory = union
    members = [{"model": MEMBER, "revision": REVISION}]
    runtime = {key: value for key, value in COMPOSITION.items() if key != "default_labels"}
    adapter = loader.load(union_config(directory / "primary" / "gliner", members, runtime), "default", "x").adapter
    (result,) = adapter.extract(extract_items(TEXTS[:1], [])).items
    assert not result.ok and "default_labels" in result.error


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([], "needs at least one other model in the load-time option 'members'"),
        ([{"model": MEMBER, "revision": "main"}], "needs a revision pinned to a full commit SHA"),
        ([{"model": MEMBER, "revision": REVISION, "options": {"batch_size": 8}}], "sets ['batch_size']"),
        ([{"model": MEMBER, "revision": REVISION, "options": {"threshold": 3}}], "Option 'threshold' must be"),
        ([{"model": "acme/absent", "revision": REVISION}], "member acme/absent"),
    ],
)
def test_a_member_that_cannot_be_served_fails_the_load_naming_it(union: tuple, members: list, message: str) -> None:
    _, _, loader, directory = union
    with pytest.raises(ModelLoadError) as raised:
        loader.load(union_config(directory / "primary" / "gliner", members, COMPOSITION), "default", "acme/u")
    assert message in str(raised.value)
    assert "acme/u" in str(raised.value)


def test_preparing_a_union_fetches_and_converts_every_member(union: tuple) -> None:
    _, _, loader, directory = union
    members = [{"model": MEMBER, "revision": REVISION, "options": MEMBER_OPTIONS}]
    model = union_config(directory / "primary" / "gliner", members, COMPOSITION)
    converted = set((directory / "cache" / "converted").glob("*.onnx"))
    for graph in converted:  # what the fixture's load converted: preparing again must make both again
        graph.unlink()
    prepared = loader.prepare(model, "default", model.sie_id)  # what `sie models pull` does
    assert prepared.model_dir == directory / "primary" / "gliner"
    assert len(set((directory / "cache" / "converted").glob("*.onnx"))) == 2  # the own checkpoint's and the member's
