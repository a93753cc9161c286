"""HTTP inference bodies against the wire examples of contracts Part B §1.4a and Part A §2.5 (sie.wire.http)."""

import json

import msgpack
import msgpack_numpy
import numpy as np
import pytest

from sie.wire import DecodeError, from_json, from_msgpack, loads_json, to_json, to_msgpack, unstructure
from sie.wire.http import (
    DenseEmbedding,
    EncodeRequest,
    EncodeResponse,
    EncodeResult,
    Entity,
    ExtractRequest,
    ExtractResponse,
    ExtractResult,
    ScoreEntry,
    ScoreRequest,
    ScoreResponse,
    SparseEmbedding,
    TimingInfo,
)


def test_sdk_encode_body_decodes_from_msgpack():
    # contracts Part A §2.5, captured from sie-sdk 0.10.1.
    body = {
        "items": [{"id": "a", "text": "hi"}],
        "params": {
            "output_types": ["dense"],
            "instruction": "q:",
            "output_dtype": "float16",
            "options": {"profile": "default", "is_query": True},
        },
    }
    request = from_msgpack(msgpack.packb(body), EncodeRequest)
    assert request.items[0].id == "a"
    assert request.params.output_dtype == "float16"
    assert request.params.options["is_query"] is True
    assert unstructure(request) == body


def test_encode_request_without_params_omits_the_key():
    request = from_json(b'{"items":[{"text":"Hello"}]}', EncodeRequest)
    assert request.params is None
    assert unstructure(request) == {"items": [{"text": "Hello"}]}


def test_msgpack_image_bytes_reach_the_item():
    body = {"items": [{"images": [{"data": b"\xff\xd8\xff", "format": "jpeg"}]}]}
    request = from_msgpack(msgpack.packb(body), EncodeRequest)
    assert request.items[0].images[0].data == b"\xff\xd8\xff"


def test_score_body_reads_query_instruction_and_options_at_top_level():
    body = {
        "query": {"id": "q", "text": "What is ML?"},
        "items": [{"text": "ML learns from data."}, {"id": "w", "text": "Sunny"}],
        "options": {"profile": "default"},
    }
    request = from_json(json.dumps(body), ScoreRequest)
    assert request.query.id == "q"
    assert [item.id for item in request.items] == [None, "w"]
    assert request.options == {"profile": "default"}
    assert unstructure(request) == body


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"items": [{"text": "a"}]}, "Object missing required field `query`"),
        ({"query": {"text": "q"}, "items": []}, "Expected `array` of length >= 1 - at `$.items`"),
    ],
)
def test_score_request_rules(body, message):
    with pytest.raises(DecodeError) as caught:
        from_json(json.dumps(body), ScoreRequest)
    assert str(caught.value) == message


def test_options_pass_as_sent():
    """Decoding keeps options as sent: their values are checked against the model (`sie.catalog.options`)."""
    options = {"threshold": 0.5, "query_template": None, "is_query": "yes", "score_weights": [1, 2], "lora": 3}
    request = from_json(json.dumps({"items": [{"text": "a"}], "params": {"options": options}}), EncodeRequest)
    assert request.params.options == options


def test_extract_body_reads_labels_from_params():
    body = {"items": [{"text": "Tim Cook is the CEO of Apple."}], "params": {"labels": ["person", "organization"]}}
    request = from_json(json.dumps(body), ExtractRequest)
    assert request.params.labels == ["person", "organization"]
    assert unstructure(request) == body


def test_encode_response_json_matches_the_example_shape():
    response = EncodeResponse(
        model="BAAI/bge-m3",
        items=[
            EncodeResult(
                id="d1",
                dense=DenseEmbedding(dims=2, dtype="float32", values=np.array([0.25, 0.5], dtype=np.float32)),
                sparse=SparseEmbedding(
                    dims=250002,
                    dtype="float32",
                    indices=np.array([3034], dtype=np.int32),
                    values=np.array([0.5], dtype=np.float32),
                ),
            )
        ],
        timing=TimingInfo(total_ms=21.25, queue_ms=1.0, tokenization_ms=0.5, inference_ms=18.5),
    )
    assert loads_json(to_json(response)) == {
        "model": "BAAI/bge-m3",
        "items": [
            {
                "id": "d1",
                "dense": {"dims": 2, "dtype": "float32", "values": [0.25, 0.5]},
                "sparse": {"dims": 250002, "dtype": "float32", "indices": [3034], "values": [0.5]},
            }
        ],
        "timing": {
            "total_ms": 21.25,
            "queue_ms": 1.0,
            "tokenization_ms": 0.5,
            "inference_ms": 18.5,
            "postprocessing_ms": None,
        },
    }


def test_encode_response_msgpack_gives_the_sdk_numpy_arrays():
    # The SDK decodes with msgpack_numpy and requires an ndarray for dense values (Part A §2.5).
    values = np.array([0.25, 0.5], dtype=np.float32)
    response = EncodeResponse(
        model="m", items=[EncodeResult(dense=DenseEmbedding(dims=2, dtype="float32", values=values))]
    )
    decoded = msgpack_numpy.unpackb(to_msgpack(response))
    assert isinstance(decoded["items"][0]["dense"]["values"], np.ndarray)
    assert np.array_equal(decoded["items"][0]["dense"]["values"], values)


def test_binary_dense_values_keep_the_model_dims():
    # x = [0.5, -1.0, 2.0] packs to [160] while dims stays 3 (contracts Part B §1.2).
    packed = np.packbits(np.array([0.5, -1.0, 2.0]) > 0)
    response = EncodeResponse(
        model="m", items=[EncodeResult(dense=DenseEmbedding(dims=3, dtype="binary", values=packed))]
    )
    dense = from_msgpack(to_msgpack(response), EncodeResponse).items[0].dense
    assert dense.dims == 3
    assert dense.values.dtype == np.uint8
    assert dense.values.tolist() == [160]


def test_score_response_json_shape():
    response = ScoreResponse(
        model="BAAI/bge-reranker-v2-m3",
        query_id="q",
        scores=[ScoreEntry(item_id="item-0", score=0.998, rank=0), ScoreEntry(item_id="w", score=0.012, rank=1)],
    )
    assert loads_json(to_json(response)) == {
        "model": "BAAI/bge-reranker-v2-m3",
        "query_id": "q",
        "scores": [{"item_id": "item-0", "score": 0.998, "rank": 0}, {"item_id": "w", "score": 0.012, "rank": 1}],
    }


def test_score_response_writes_a_null_query_id():
    assert unstructure(ScoreResponse(model="m", query_id=None, scores=[]))["query_id"] is None


def test_extract_result_always_carries_the_four_lists_and_data():
    response = ExtractResponse(
        model="urchade/gliner_multi-v2.1",
        items=[
            ExtractResult(id="item-0", entities=[Entity(text="Tim Cook", label="person", score=0.96, start=0, end=8)])
        ],
    )
    assert loads_json(to_json(response)) == {
        "model": "urchade/gliner_multi-v2.1",
        "items": [
            {
                "id": "item-0",
                "entities": [
                    {"text": "Tim Cook", "label": "person", "score": 0.96, "start": 0, "end": 8, "bbox": None}
                ],
                "relations": [],
                "classifications": [],
                "objects": [],
                "data": {},
            }
        ],
    }


def test_extract_result_reads_a_minimal_result():
    result = from_json(b'{"id":"item-3"}', ExtractResult)
    assert (result.entities, result.relations, result.classifications, result.objects, result.data) == (
        [],
        [],
        [],
        [],
        {},
    )


@pytest.mark.parametrize("multivector", [[[1.0, 2.0], [3.0]], [["a", "b"]], [[1.0, None]], [[{"x": 1}]]])
def test_a_ragged_or_non_numeric_array_is_refused_in_plain_words(multivector) -> None:
    body = {"items": [{"text": "a", "multivector": multivector}]}
    with pytest.raises(DecodeError) as caught:
        from_json(json.dumps(body), EncodeRequest)
    assert str(caught.value) == "Expected a rectangular array of numbers - at `$.items[0]`"
