"""The baseline models from their offline sources, through the adapters, checked for real behaviour."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from sie.tokenization import pad_batch
from sie.wire import codes
from sie.wire.ipc_batch import EncodeBatchItem, ExtractBatchItem, PreparedTokens, ScoreBatchItem
from sie.worker.adapters.sparse import rows_per_run
from support.worker_items import encode_items

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
L3 = "sentence-transformers/paraphrase-MiniLM-L3-v2"
SPLADE = "rasyosef/splade-tiny"
RAMPART = "nationaldesignstudio/rampart"
HELLO_WORLD_PREFIX = [-0.034477, 0.031023, 0.006735, 0.026109]  # the public SIE server, same weights

PAIRS = [
    ("A man is playing a guitar.", "Someone is playing an instrument.", "The stock market fell sharply today."),
    ("How do I reset my password?", "Steps to recover access to your account.", "The recipe needs two eggs."),
    ("A cat sits on the mat.", "A kitten is resting on a rug.", "Quarterly revenue grew by ten percent."),
]
FRANCE_DOCS = [
    {"id": "paris", "text": "Paris is the capital and most populous city of France."},
    {"text": "Berlin is the capital of Germany."},
    {"text": "Mitochondria are the powerhouse of the cell."},
]


def score_item(query, docs, **fields):
    return ScoreBatchItem(
        work_item_id="s.0", request_id="s", item_index=0, total_items=1, timestamp=0.0,
        query_item={"text": query}, score_items=docs, **fields,
    )  # fmt: skip


def extract_item(text, labels=None):
    return ExtractBatchItem(
        work_item_id="x.0",
        request_id="x",
        item_index=0,
        total_items=1,
        timestamp=0.0,
        item={"text": text},
        labels=labels,
    )


def dense(load_model, model_id, texts):
    batch = load_model(model_id).adapter.encode(encode_items(texts))
    return np.stack([item.result["dense"]["values"] for item in batch.items])


def test_minilm_matches_the_public_server(load_model) -> None:
    (vector,) = dense(load_model, MINILM, ["Hello world"])
    assert np.allclose(vector[:4], HELLO_WORLD_PREFIX, atol=1e-5)
    assert np.isclose(np.linalg.norm(vector), 1.0, atol=1e-5)


@pytest.mark.parametrize("model_id", [MINILM, f"{MINILM}:int8", L3])
def test_related_sentences_score_higher_dense(load_model, model_id) -> None:
    for anchor, related, unrelated in PAIRS:
        a, r, u = dense(load_model, model_id, [anchor, related, unrelated])
        cos = lambda x, y: float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))  # noqa: E731
        assert cos(a, r) > cos(a, u) + 0.2


@pytest.mark.parametrize("model_id", [MINILM, f"{MINILM}:multivector", L3, SPLADE])
def test_bi_encoder_score_ranks_the_relevant_document_first(load_model, model_id) -> None:
    batch = load_model(model_id).adapter.score([score_item("What is the capital of France?", FRANCE_DOCS)])
    ranked = batch.items[0].result
    assert [row["item_id"] for row in ranked][0] == "paris"
    assert [row["rank"] for row in ranked] == [0, 1, 2]
    assert {row["item_id"] for row in ranked} == {"paris", "item-1", "item-2"}


def test_splade_expands_the_query(load_model) -> None:
    loaded = load_model(SPLADE)
    (item,) = loaded.adapter.encode(encode_items(["capital of France"])).items
    sparse = item.result["sparse"]
    assert sparse["dims"] == 30522
    terms = {
        loaded.tokenizer.id_to_token(int(i)): float(v) for i, v in zip(sparse["indices"], sparse["values"], strict=True)
    }
    assert {"capital", "france"} <= terms.keys()
    assert {"french", "paris", "city"} & terms.keys(), "expansion adds related terms not in the input"
    assert not {"[CLS]", "[SEP]", "[PAD]"} & terms.keys()


def test_a_splade_batch_larger_than_the_logits_budget_runs_in_slices_with_the_same_results(load_model) -> None:
    adapter = load_model(SPLADE).adapter
    long_texts = [f"document {index} " + "words about dogs and cats and the weather " * (60 + index * 10)
                  for index in range(8)]  # fmt: skip
    alone = [adapter.encode(encode_items([text])).items[0].result["sparse"] for text in long_texts]
    batch = pad_rows(adapter, long_texts)
    assert rows_per_run(batch.input_ids.shape[1], adapter.tokenizer.vocab_size) < len(long_texts)  # it slices
    together = [item.result["sparse"] for item in adapter.encode(encode_items(long_texts)).items]
    for single, sliced in zip(alone, together, strict=True):
        assert np.array_equal(single["indices"], sliced["indices"])
        assert np.allclose(single["values"], sliced["values"], atol=1e-4)


def test_a_batch_over_the_run_memory_budget_runs_in_slices_with_the_same_results(load_model) -> None:
    adapter = load_model(RAMPART).adapter
    tight = type(adapter)(attrs.evolve(adapter.context, run_memory_bytes=1))  # one row per run
    texts = [f"Contact Maria Lopez at maria{index}@example.com about invoice {index}. " * (index + 1)
             for index in range(6)]  # fmt: skip
    whole = [item.result["entities"] for item in adapter.extract([extract_item(text) for text in texts]).items]
    sliced = [item.result["entities"] for item in tight.extract([extract_item(text) for text in texts]).items]
    assert any(whole)
    for want, got in zip(whole, sliced, strict=True):
        assert [(e["text"], e["label"], e["start"], e["end"]) for e in got] == [
            (e["text"], e["label"], e["start"], e["end"]) for e in want
        ]
        assert np.allclose([e["score"] for e in got], [e["score"] for e in want], atol=1e-4)
    encoder = load_model(MINILM).adapter
    tight_encoder = type(encoder)(attrs.evolve(encoder.context, run_memory_bytes=1))
    vectors = [item.result["dense"]["values"] for item in encoder.encode(encode_items(texts)).items]
    sliced_vectors = [item.result["dense"]["values"] for item in tight_encoder.encode(encode_items(texts)).items]
    for want, got in zip(vectors, sliced_vectors, strict=True):
        assert np.allclose(got, want, atol=1e-5)


def pad_rows(adapter, texts: list[str]):
    tokens = adapter.tokenizer.encode_batch(texts)
    return pad_batch([t.input_ids for t in tokens], [t.token_type_ids for t in tokens], adapter.tokenizer.pad_id)


def test_sparse_and_dense_related_pairs(load_model) -> None:
    batch = load_model(SPLADE).adapter.score(
        [score_item("A man is playing a guitar.", [{"text": "A man plays guitar on stage."}, {"text": PAIRS[0][2]}])]
    )
    assert batch.items[0].result[0]["item_id"] == "item-0"


def test_ner_finds_the_name_with_offsets(load_model) -> None:
    text = "My name is Tim Cook and I live at 1 Infinite Loop, Cupertino, CA 95014."
    (item,) = load_model(RAMPART).adapter.extract([extract_item(text)]).items
    entities = {(e["label"], e["text"]) for e in item.result["entities"]}
    assert {
        ("GIVEN_NAME", "Tim"),
        ("SURNAME", "Cook"),
        ("STREET_NAME", "Infinite Loop"),
        ("CITY", "Cupertino"),
    } <= entities
    for entity in item.result["entities"]:
        assert text[entity["start"] : entity["end"]] == entity["text"]
    assert item.result["relations"] == [] and item.result["data"] == {}


def test_ner_filters_by_requested_labels(load_model) -> None:
    text = "Please contact Maria Garcia at maria.garcia@example.com or +1 415 555 0132."
    (item,) = load_model(RAMPART).adapter.extract([extract_item(text, labels=["given name", "Email"])]).items
    assert {e["label"] for e in item.result["entities"]} == {"GIVEN_NAME", "EMAIL"}


def test_padding_does_not_leak_into_vectors(load_model) -> None:
    rng = np.random.default_rng(7)
    words = np.array(
        ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "music", "plays", "softly"]
    )
    texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 40)))) for _ in range(32)]
    for model_id in (MINILM, SPLADE):
        adapter = load_model(model_id).adapter
        batched = adapter.encode(encode_items(texts)).items
        for text, item in zip(texts, batched, strict=True):
            (single,) = adapter.encode(encode_items([text])).items
            kind = adapter.default_output
            assert np.allclose(item.result[kind]["values"], single.result[kind]["values"], atol=1e-5)


def test_multivector_drops_special_tokens(load_model) -> None:
    (item,) = load_model(f"{MINILM}:multivector").adapter.encode(encode_items(["Hello world"])).items
    multivector = item.result["multivector"]
    assert (multivector["num_tokens"], multivector["token_dims"]) == (2, 384)
    assert np.allclose(np.linalg.norm(multivector["values"], axis=1), 1.0, atol=1e-5)


def test_output_dtypes_and_bad_items_do_not_fail_batch_mates(load_model) -> None:
    items = encode_items(["one", "two", "three"], options={"output_dtype": "binary"})
    items[1] = encode_items(["x"], output_types=["sparse"])[0]
    items.append(
        EncodeBatchItem(work_item_id="r.9", request_id="r", item_index=9, total_items=4, timestamp=0.0, item={})
    )
    results = load_model(MINILM).adapter.encode(items).items
    assert results[0].result["dense"]["dtype"] == "binary" and results[0].result["dense"]["values"].shape == (48,)
    assert results[1].error_code == codes.INVALID_INPUT and "sparse" in results[1].error
    assert results[2].ok and results[3].error_code == codes.INVALID_INPUT


def test_an_unknown_pooling_is_the_items_invalid_input_not_a_failed_batch(load_model) -> None:
    items = encode_items(["one", "two"])
    items[1] = encode_items(["two"], options={"pooling": "zz"})[0]
    first, second = load_model(MINILM).adapter.encode(items).items
    assert first.ok
    assert second.error_code == codes.INVALID_INPUT and "pooling" in second.error


def test_rows_of_one_batch_with_different_pooling_get_each_their_own(load_model) -> None:
    adapter = load_model(MINILM).adapter
    texts = ["A cat sits on the mat.", "Quarterly revenue grew by ten percent.", "Hello"]
    options = [{}, {"pooling": "cls", "normalize": False}, {"normalize": False}]
    items = [encode_items([text], options=option)[0] for text, option in zip(texts, options, strict=True)]
    together = [item.result["dense"]["values"] for item in adapter.encode(items).items]
    alone = [adapter.encode([item]).items[0].result["dense"]["values"] for item in items]
    for mixed, single in zip(together, alone, strict=True):
        assert np.allclose(mixed, single, atol=1e-5)
    assert np.isclose(np.linalg.norm(together[0]), 1.0, atol=1e-5)
    assert not np.isclose(np.linalg.norm(together[1]), 1.0, atol=1e-2)
    assert not np.allclose(together[1], together[0], atol=1e-2)


def test_long_input_is_truncated_or_rejected(load_model) -> None:
    long_text = "word " * 2000
    adapter = load_model(MINILM).adapter
    (truncated,) = adapter.encode(encode_items([long_text])).items
    assert truncated.ok and truncated.input_tokens == 256
    (rejected,) = adapter.encode(encode_items([long_text], options={"truncate": False})).items
    assert rejected.error_code == codes.INPUT_TOO_LONG


def test_max_seq_length_cuts_a_text_as_truncation_at_that_length_would(load_model) -> None:
    """The option keeps the first tokens and the closing [SEP]: the vector of the text cut to two words."""
    adapter = load_model(MINILM).adapter
    cut, short = adapter.encode(
        [*encode_items(["Hello world and more words"], options={"max_seq_length": 4}), *encode_items(["Hello world"])]
    ).items
    assert cut.input_tokens == short.input_tokens == 4
    assert np.allclose(cut.result["dense"]["values"], short.result["dense"]["values"], atol=1e-6)
    options = {"max_seq_length": 4, "truncate": False}
    (rejected,) = adapter.encode(encode_items(["Hello world and more"], options=options)).items
    assert rejected.error_code == codes.INPUT_TOO_LONG and "longer than 4 tokens" in rejected.error


def test_prepared_tokens_are_reused_only_from_the_same_tokenizer(load_model) -> None:
    loaded = load_model(MINILM)
    (tokens,) = loaded.tokenizer.encode_batch(["Hello world"])
    good = PreparedTokens(input_ids=[tokens.input_ids], tokenizer_id=loaded.tokenizer.tokenizer_id)
    stale = PreparedTokens(input_ids=[[101, 102]], tokenizer_id="0" * 32)
    results = loaded.adapter.encode(
        encode_items(["Hello world"], prepared_tokens=good) + encode_items(["Hello world"], prepared_tokens=stale)
    ).items
    assert np.allclose(results[0].result["dense"]["values"], results[1].result["dense"]["values"], atol=1e-6)


def test_a_template_placing_the_instruction_gets_the_default_one_and_is_tokenized_here(load_model) -> None:
    """stella's query template (`Instruct: {instruction}\nQuery: {text}`) with its `default_instruction`: the sidecar
    cannot know the default, so tokens it prepared from the bare template are not reused."""
    loaded = load_model(MINILM)
    options = {"query_template": "Instruct: {instruction}\nQuery: {text}", "default_instruction": "find the city"}
    (bare,) = loaded.tokenizer.encode_batch(["Instruct: \nQuery: Paris"])
    prepared = PreparedTokens(input_ids=[bare.input_ids], tokenizer_id=loaded.tokenizer.tokenizer_id)
    templated, spelled = loaded.adapter.encode(
        encode_items(["Paris"], options=options, is_query=True, prepared_tokens=prepared)
        + encode_items(["Instruct: find the city\nQuery: Paris"])
    ).items
    assert np.allclose(templated.result["dense"]["values"], spelled.result["dense"]["values"], atol=1e-6)


def test_operations_the_model_lacks_are_invalid_input(load_model) -> None:
    (item,) = load_model(RAMPART).adapter.encode(encode_items(["Hello"])).items
    assert item.error_code == codes.INVALID_INPUT and "does not support encode" in item.error
