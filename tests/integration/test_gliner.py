"""GLiNER span models served through the worker against the `gliner` package on the same tiny random checkpoints
(DeBERTa-v2 and BERT backbones, with and without the LSTM, and a bi-encoder whose labels a BERT encoder of their own
reads): the same spans, labels and character offsets, scores
within 1e-4, across thresholds, flat and nested spans, one or several labels per span, narrower spans by option, rows
of one batch with label sets of their own; a text longer than the model reads at once is read in windows, each
span scored as gliner scores it in its window; and what cannot run is refused per item."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sie.catalog import parse_model_config
from sie.worker.adapters.base import invalid
from sie.worker.spans import plan_windows, split_words
from support.worker_items import extract_items
from support.zero_shot_checkpoints import save_gliner

TOLERANCE = 1e-4
TEXTS = [
    "Steve Jobs founded Apple in Cupertino California in 1976.",
    "Marie Curie won the Nobel Prize in Physics and Chemistry.",
    "Barack Obama was born in Honolulu, Hawaii.",
    "The quick brown fox jumps over the lazy dog near Paris",
]
LABELS = ["person", "organization", "city", "award"]
VARIANTS = {
    "deberta-lstm": {"backbone": "deberta-v2"},
    "bert-no-lstm": {"backbone": "bert", "num_rnn_layers": 0, "hidden_size": 32},
    "bi-encoder": {"backbone": "deberta-v2", "labels_encoder": True},
    "token-level": {"backbone": "deberta-v2", "span_mode": "token_level"},
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, model_loader) -> tuple[Any, Any]:
    directory = tmp_path_factory.mktemp(request.param)
    reference = save_gliner(directory, **VARIANTS[request.param])
    model = parse_model_config({
        "sie_id": f"acme/gliner-{request.param}", "weights_path": str(directory / "gliner"),
        "tasks": {"extract": {}},
        "profiles": {"default": {"adapter_path": "sie_server.adapters.gliner:GLiNERAdapter",
                                 "max_batch_tokens": 4096}},
    })  # fmt: skip
    return reference, model_loader.load(model, "default", model.sie_id).adapter


def assert_same_entities(ours: list[dict], theirs: list[dict]) -> None:
    assert [(e["start"], e["end"], e["label"], e["text"]) for e in ours] == [
        (e["start"], e["end"], e["label"], e["text"]) for e in theirs
    ]
    assert np.allclose([e["score"] for e in ours], [e["score"] for e in theirs], atol=TOLERANCE, rtol=0)


def assert_extracts_as_gliner(reference: Any, adapter: Any, labels: list[str], **options: Any) -> None:
    """Our adapter's entities for TEXTS and `labels` under `options` equal the gliner package's (some found)."""
    results = adapter.extract(extract_items(TEXTS, labels, **options)).items
    expected = reference.inference(TEXTS, labels, **options)
    assert any(expected), "the threshold must find spans"
    for result, theirs in zip(results, expected, strict=True):
        assert result.ok, result.error
        assert_same_entities(result.result["entities"], theirs)
        assert result.input_tokens > 0


@pytest.mark.parametrize("threshold", [0.27, 0.3])
@pytest.mark.parametrize(("flat_ner", "multi_label"), [(True, False), (False, False), (False, True), (True, True)])
def test_entities_equal_gliner(served: tuple[Any, Any], threshold: float, flat_ner: bool, multi_label: bool) -> None:
    reference, adapter = served
    assert_extracts_as_gliner(
        reference, adapter, LABELS, threshold=threshold, flat_ner=flat_ner, multi_label=multi_label
    )


def test_rows_with_label_sets_of_their_own_batch_together(served: tuple[Any, Any]) -> None:
    reference, adapter = served
    label_sets = [["person"], ["award", "person", "city"], LABELS, ["organization", "person", "person"]]
    results = adapter.extract(extract_items(TEXTS, label_sets, threshold=0.27)).items
    for text, labels, result in zip(TEXTS, label_sets, results, strict=True):
        (theirs,) = reference.inference([text], labels, threshold=0.27)
        assert_same_entities(result.result["entities"], theirs)


def test_max_width_keeps_only_shorter_spans(served: tuple[Any, Any]) -> None:
    reference, adapter = served
    results = adapter.extract(extract_items(TEXTS, LABELS, threshold=0.25, flat_ner=False, max_width=2)).items
    wide = adapter.extract(extract_items(TEXTS, LABELS, threshold=0.25, flat_ner=False)).items
    words = [len(split_words(e["text"])) for result in results for e in result.result["entities"]]
    assert words and max(words) <= 2
    assert max(len(split_words(e["text"])) for result in wide for e in result.result["entities"]) > 2


def test_a_long_text_is_read_in_windows_with_offsets_into_the_whole_text(served: tuple[Any, Any]) -> None:
    reference, adapter = served
    text = " ".join(TEXTS * 6)  # 240 words, the model reads 64 at once
    (result,) = adapter.extract(extract_items([text], LABELS, threshold=0.1, flat_ner=False)).items
    entities = result.result["entities"]
    words = split_words(text)
    (counts,) = adapter.tokenizer.word_token_counts([[word.text for word in words]])
    (prompt,) = adapter.tokenizer.encode_words([adapter._prompt(LABELS)])
    windows = plan_windows(counts, adapter.settings.max_len, adapter.tokenizer.max_length - len(prompt),
                           adapter.overlap)  # fmt: skip
    assert len(windows) > 2
    starts = {word.start: index for index, word in enumerate(words)}
    owners = [next(i for i, w in enumerate(windows) if w.own_start <= starts[e["start"]] < w.own_stop)
              for e in entities]  # fmt: skip
    assert set(owners) == set(range(len(windows))), "every window finds spans"
    compared = 0
    for index, window in enumerate(windows):
        offset = words[window.start].start
        window_text = text[offset : words[window.stop - 1].end]
        (theirs,) = reference.inference([window_text], LABELS, threshold=0.1, flat_ner=False, multi_label=True)
        scored = {(e["start"] + offset, e["end"] + offset, e["label"]): e["score"] for e in theirs}
        for entity, owner in zip(entities, owners, strict=True):
            assert text[entity["start"] : entity["end"]] == entity["text"]
            key = (entity["start"], entity["end"], entity["label"])
            if owner == index and key in scored:  # gliner may drop it for a span another window owns
                assert abs(scored[key] - entity["score"]) <= TOLERANCE
                compared += 1
    assert compared >= len(entities) // 2


def test_what_cannot_run_is_refused_per_item(served: tuple[Any, Any]) -> None:
    _, adapter = served
    items = [
        *extract_items([TEXTS[0]], []),
        *extract_items(["   "], LABELS),
        *extract_items([TEXTS[0]], [f"label number {index}" for index in range(200)]),
        *extract_items([TEXTS[0]], LABELS, relation_labels=["works for"]),
        *extract_items([TEXTS[1]], LABELS, threshold=0.1),
    ]
    results = adapter.extract(items).items
    if adapter.model.sie_id.endswith("bi-encoder"):  # labels read on their own take no room from the text
        assert results[2].ok
        results[2] = invalid("leave none for the text")
    assert [result.error_code for result in results[:4]] == ["INVALID_INPUT"] * 4
    assert "labels" in results[0].error and "non-blank" in results[1].error
    assert "leave none for the text" in results[2].error and "relation_labels" in results[3].error
    assert results[4].ok and results[4].result["entities"]


class CountingSession:
    """A session that counts the label rows it encodes."""

    def __init__(self, session: Any) -> None:
        self.session, self.rows = session, 0

    def get_inputs(self) -> Any:
        return self.session.get_inputs()

    def run(self, outputs: Any, feeds: dict) -> Any:
        self.rows += len(feeds["input_ids"])
        return self.session.run(outputs, feeds)


@pytest.mark.parametrize("served", ["bi-encoder"], indirect=True)
def test_a_bi_encoder_scores_more_labels_than_its_span_width_as_gliner_does(served: tuple[Any, Any]) -> None:
    """With fewer labels than 4/3 of the span width (24 here) the graph folds the labels through the span layer's
    last projection; with more it projects the spans (`head_layers.marker_span_logits`): the same entities."""
    reference, adapter = served
    labels = LABELS + [f"kind {index}" for index in range(36)]
    assert_extracts_as_gliner(reference, adapter, labels, threshold=0.27, flat_ner=False, multi_label=True)


@pytest.mark.parametrize("served", ["bi-encoder"], indirect=True)
def test_a_bi_encoder_encodes_each_label_once(served: tuple[Any, Any]) -> None:
    _, adapter = served
    encoder = adapter._label_encoder
    counting = encoder._session = CountingSession(encoder._session)
    fresh = ["painter", "river", "painter"]  # labels no other test sends
    label_sets = [fresh, ["river", "sculptor"], fresh, ["painter"]]
    first = adapter.extract(extract_items(TEXTS, label_sets)).items
    assert counting.rows == 3  # each distinct label once across the batch
    again = adapter.extract(extract_items(TEXTS, label_sets)).items
    assert counting.rows == 3 and [r.result for r in first] == [r.result for r in again]  # then from the cache
