"""Request options against the kind of model that reads them (`sie.catalog.options`, issue 14 §1)."""

from __future__ import annotations

import pytest

from sie.catalog.adapters import (
    CONTEXT_PRUNER,
    CROSS_ENCODER,
    DENSE,
    MULTIVECTOR,
    SPARSE,
    TOKEN_CLASSIFICATION,
    adapter_kind,
)
from sie.catalog.options import MAX_OPTION_TEXT_CHARS, option_problem
from sie.wire.queue import OPERATION_ENCODE, OPERATION_EXTRACT, OPERATION_SCORE


def test_adapter_paths_name_kinds_by_module() -> None:
    assert adapter_kind("sie.adapters.dense:DenseAdapter") == DENSE
    assert adapter_kind("sie_server.adapters.sentence_transformer:SentenceTransformerDenseAdapter") == DENSE
    assert adapter_kind("sie_server.adapters.splade_flash:SpladeFlashAdapter") == SPARSE
    assert adapter_kind("sie_server.adapters.colbert") == MULTIVECTOR
    assert adapter_kind("sie_server.adapters.stablebridge_pruner:StablebridgePrunerAdapter") == CONTEXT_PRUNER
    # one public module, two kinds: the class decides
    assert adapter_kind("sie_server.adapters.sentence_transformer:SentenceTransformerSparseAdapter") == SPARSE
    assert adapter_kind("nowhere.adapters:X") is None
    assert adapter_kind(None) is None


@pytest.mark.parametrize(
    ("options", "kind", "operation"),
    [
        ({"pooling": "cls", "normalize": False, "truncate": True, "output_dtype": "int8"}, DENSE, OPERATION_ENCODE),
        ({"output_types": ["sparse"], "query_template": "query: {text}", "is_query": True}, SPARSE, OPERATION_ENCODE),
        ({"instruction": "Represent:", "profile": "default", "lora_id": None}, MULTIVECTOR, OPERATION_ENCODE),
        ({"muvera": {}, "output_types": ["dense"]}, MULTIVECTOR, OPERATION_ENCODE),  # MUVERA's dense encoding
        ({"instruction": None, "doc_template": "passage: {text}"}, DENSE, OPERATION_SCORE),
        ({"instruction": "rank:"}, CROSS_ENCODER, OPERATION_SCORE),
        ({"threshold": 0, "muvera": False}, TOKEN_CLASSIFICATION, OPERATION_EXTRACT),
        ({"threshold": 1.0}, TOKEN_CLASSIFICATION, OPERATION_EXTRACT),
        ({"prune_threshold": 0.4, "highlight_threshold": 0.8}, CONTEXT_PRUNER, OPERATION_EXTRACT),
        # Keys SIE does not read pass: a newer client's, or the SDK's client-level options merged in.
        ({"score_weights": [1, 2], "newer_client_flag": {"x": 1}}, DENSE, OPERATION_ENCODE),
        # An unknown kind still has its values checked, but not their applicability.
        ({"pooling": "last", "threshold": 0.5}, None, OPERATION_ENCODE),
    ],
)  # fmt: skip
def test_options_a_model_reads_pass(options, kind, operation) -> None:
    assert option_problem(options, kind, operation) is None


@pytest.mark.parametrize(
    ("options", "kind", "operation", "message"),
    [
        ({"pooling": "max"}, DENSE, OPERATION_ENCODE,
         "Option 'pooling' must be null or one of ['mean', 'cls', 'last', 'last_token']; got 'max'"),
        ({"pooling": 5}, None, OPERATION_ENCODE,
         "Option 'pooling' must be null or one of ['mean', 'cls', 'last', 'last_token']; got 5"),
        ({"doc_template": {"a": 1}}, DENSE, OPERATION_ENCODE,
         "Option 'doc_template' must be null or a string of at most 4096 characters holding {text} at most once; "
         "got {'a': 1}"),
        ({"query_template": "{text} {text}"}, SPARSE, OPERATION_ENCODE, "Option 'query_template' must be null or a"),
        ({"instruction": "x" * (MAX_OPTION_TEXT_CHARS + 1)}, DENSE, OPERATION_ENCODE,
         "Option 'instruction' must be null or a string of at most 4096 characters; got 'xxxx"),
        ({"normalize": []}, DENSE, OPERATION_ENCODE, "Option 'normalize' must be true or false; got []"),
        ({"is_query": "yes"}, DENSE, OPERATION_ENCODE, "Option 'is_query' must be true or false; got 'yes'"),
        ({"truncate": 0}, MULTIVECTOR, OPERATION_ENCODE, "Option 'truncate' must be true or false; got 0"),
        ({"output_types": []}, DENSE, OPERATION_ENCODE, "Option 'output_types' must be null or a non-empty list"),
        ({"output_types": ["vectors"]}, DENSE, OPERATION_ENCODE, "Option 'output_types' must be null or a non-empty"),
        ({"threshold": True}, TOKEN_CLASSIFICATION, OPERATION_EXTRACT, "Option 'threshold' must be a number from 0"),
        ({"threshold": float("nan")}, TOKEN_CLASSIFICATION, OPERATION_EXTRACT, "Option 'threshold' must be a number"),
        ({"threshold": 1.5}, TOKEN_CLASSIFICATION, OPERATION_EXTRACT, "Option 'threshold' must be a number from 0"),
        ({"prune_threshold": 2}, CONTEXT_PRUNER, OPERATION_EXTRACT, "Option 'prune_threshold' must be a number from 0"),
        ({"threshold": 0.5}, CONTEXT_PRUNER, OPERATION_EXTRACT, "Option 'threshold' does not apply to a context"),
        ({"lora_id": "my-lora"}, DENSE, OPERATION_ENCODE,
         "Option 'lora_id' must be null (LoRA adapters are not supported); got 'my-lora'"),
        ({"muvera": True}, MULTIVECTOR, OPERATION_ENCODE, "Option 'muvera' must be null, false, or {} (MUVERA's"),
        ({"muvera": {"num_repetitions": 4}}, MULTIVECTOR, OPERATION_ENCODE, "Option 'muvera' must be null, false, or"),
        ({"muvera": {}}, DENSE, OPERATION_ENCODE,
         "Option 'muvera' folds a multi-vector model's token vectors; this is a dense embedding model"),
        ({"pooling": "cls"}, SPARSE, OPERATION_ENCODE,
         "Option 'pooling' does not apply to a sparse embedding model; it reads"),
        ({"pooling": "mean"}, CROSS_ENCODER, OPERATION_SCORE, "Option 'pooling' does not apply to a cross-encoder;"),
        ({"output_dtype": "int8"}, TOKEN_CLASSIFICATION, OPERATION_EXTRACT,
         "Option 'output_dtype' does not apply to an entity extraction model;"),
        ({"output_dtype": "int8"}, DENSE, OPERATION_SCORE,
         "Option 'output_dtype' does not apply to a dense embedding model when scoring;"),
    ],
)  # fmt: skip
def test_bad_options_are_named_with_what_they_allow(options, kind, operation, message) -> None:
    problem = option_problem(options, kind, operation)
    assert problem is not None and problem.startswith(message)


def test_a_large_value_is_cut_short_in_the_message() -> None:
    problem = option_problem({"pooling": "m" * 100_000}, DENSE, OPERATION_ENCODE)
    assert problem is not None and len(problem) < 200 and problem.endswith("...")
