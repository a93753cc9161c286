"""GLiNER2's text preparation as the gliner2 package does it (the schema before the text, its words lower-cased with
their offsets, a sentence end added), its request options and its greedy span decoding, as pure functions; served
against the package in tests/integration/test_gliner2.py."""

from __future__ import annotations

import random

import pytest

from sie.catalog.adapters import GLINER2, GLINER2_DECIDE, adapter_kind
from sie.catalog.options import option_problem
from sie.wire.queue import OPERATION_EXTRACT
from sie.worker.adapters.gliner2 import Schema, Settings, _kept, model_text, row_prefix, schema_words, split_words


def test_words_are_lower_cased_with_offsets_into_the_text() -> None:
    text = "Mail Ann-Lee at ann@x.org or see https://x.org/a?b, @ann_lee!"
    words = split_words(text)
    assert [w.text for w in words] == ["mail", "ann-lee", "at", "ann@x.org", "or", "see", "https://x.org/a?b,",
                                       "@ann_lee", "!"]  # fmt: skip
    assert all(text[w.start : w.end].lower() == w.text for w in words)
    # a combining mark (a decomposed é) stays inside its word, as gliner2 reads it
    assert [w.text for w in split_words("cafe\u0301 ok")] == ["cafe\u0301", "ok"]


def test_a_sentence_end_is_added_to_a_text_without_one() -> None:
    assert model_text("Hello there") == "Hello there."
    assert [model_text(t) for t in ("Hi.", "Hi!", "Hi?")] == ["Hi.", "Hi!", "Hi?"]


def test_the_schemas_read_their_markers_before_the_text() -> None:
    assert schema_words("entities", ["person", "drug dosage"], "[E]") == [
        "(", "[P]", "entities", "(", "[E]", "person", "[E]", "drug dosage", ")", ")",
    ]  # fmt: skip
    words, markers = row_prefix(
        [Schema("works for", ("head", "tail"), "[R]"), Schema("born in", ("head", "tail"), "[R]")]
    )
    assert words == ["(", "[P]", "works for", "(", "[R]", "head", "[R]", "tail", ")", ")", "[SEP_STRUCT]",
                     "(", "[P]", "born in", "(", "[R]", "head", "[R]", "tail", ")", ")", "[SEP_TEXT]"]  # fmt: skip
    assert [[words[part] for part in schema] for schema in markers] == [["[P]", "[R]", "[R]"]] * 2
    assert markers[1][0] == 12


def test_settings_read_the_public_options_and_refuse_a_bad_one() -> None:
    settings = Settings.read({"classification_task": "prompt_safety", "default_labels": ["safe", "unsafe"],
                              "positive_label": "unsafe", "threshold": 0.3, "max_prompt_tokens": 2048})  # fmt: skip
    assert (settings.classification_task, settings.default_labels, settings.threshold) == (
        "prompt_safety", ("safe", "unsafe"), 0.3
    )  # fmt: skip
    with pytest.raises(ValueError, match="Option 'threshold' must be a number from 0 to 1"):
        Settings.read({"threshold": 2})
    with pytest.raises(ValueError, match="default_labels"):
        Settings.read({"default_labels": "safe"})


def test_the_public_modules_route_to_gliner2_and_its_options_are_checked() -> None:
    for module in ("gliner2.adapter:GLiNER2Adapter", "gliner2.classification:GLiNER2ClassificationAdapter",
                   "gliner2.entities:GLiNER2EntitiesAdapter"):  # fmt: skip
        assert adapter_kind(f"sie_server.adapters.{module}") == GLINER2
    assert adapter_kind("sie_server.adapters.gliner2.decide:GLiNER2DecideAdapter") == GLINER2_DECIDE
    assert option_problem({"classification_task": "topic", "multi_label": True}, GLINER2, OPERATION_EXTRACT) is None
    assert "does not apply" in option_problem({"flat_ner": True}, GLINER2, OPERATION_EXTRACT)


def _request(labels: list[str], **settings: object) -> object:
    from sie.worker.adapters.gliner2 import Gliner2Request

    return Gliner2Request("t", "t.", [], labels, "task", Settings(**settings))  # type: ignore[arg-type]


def test_a_long_texts_classification_pools_its_windows() -> None:
    from sie.worker.adapters.gliner2 import _pooled

    windows = [[("safe", 0.9)], [("unsafe", 0.6)], [("unsafe", 0.7)]]
    # a text takes the positive label when any window does, at its surest window's score
    guard = _request(["safe", "unsafe"], positive_label="unsafe", threshold=0.0)
    assert _pooled(windows, guard) == [{"label": "unsafe", "score": 0.7}]
    # of two labels with no window taking it, the window least sure of the other (most of the positive one)
    assert _pooled([[("safe", 0.9)], [("safe", 0.55)]], guard) == [{"label": "safe", "score": 0.55}]
    # without a positive label: the surest window; multi-label: each label's best score, over the threshold
    assert _pooled(windows, _request(["safe", "unsafe"])) == [{"label": "safe", "score": 0.9}]
    multi = _request(["a", "b", "c"], multi_label=True, threshold=0.5)
    assert _pooled([[("a", 0.6), ("b", 0.4)], [("b", 0.8), ("c", 0.3)]], multi) == [
        {"label": "b", "score": 0.8}, {"label": "a", "score": 0.6},
    ]  # fmt: skip
    # one window: as it is, cut at the threshold
    assert _pooled([[("safe", 0.4)]], _request(["safe", "unsafe"], threshold=0.5)) == []


def test_greedy_decoding_keeps_the_best_spans_that_overlap_no_better_one() -> None:
    # (first word, score, start, end): the best first, ties in the order given; touching spans do not overlap
    spans = [(0, 0.5, 0, 10), (1, 0.9, 5, 12), (2, 0.9, 12, 20), (3, 0.7, 11, 13), (4, 0.6, 20, 25), (5, 0.6, 0, 5)]
    assert _kept(spans) == [(1, 0.9, 5, 12), (2, 0.9, 12, 20), (4, 0.6, 20, 25), (5, 0.6, 0, 5)]
    # against the definition, every kept span checked against every earlier one, on random spans with ties
    rng = random.Random(0)
    for _ in range(500):
        spans = [(i, rng.randint(0, 9) / 10, start, start + rng.randint(1, 12))
                 for i, start in enumerate(rng.randint(0, 60) for _ in range(rng.randint(0, 40)))]  # fmt: skip
        expected: list[tuple[int, float, int, int]] = []
        for span in sorted(spans, key=lambda span: span[1], reverse=True):
            if all(span[3] <= other[2] or other[3] <= span[2] for other in expected):
                expected.append(span)
        assert _kept(spans) == expected
