"""Wire vectors from reference/contracts.md that sie.wire must reproduce exactly."""

import json

import msgpack
import msgpack_numpy
import numpy as np
import pytest

from sie.wire import DecodeError, from_json, from_msgpack, packb, structure, to_msgpack, unpackb, unstructure
from sie.wire.http import DenseEmbedding, EncodeRequest, EncodeResponse, EncodeResult
from sie.wire.ipc import IpcResponse
from sie.wire.ipc_control import EnsureModelReadyResponse
from sie.wire.queue import WorkItem

# contracts Part B §1.9: msgpack of
# {"model":"m","items":[{"dense":{"dims":3,"dtype":"float32","values":f32[0.5,-1,2]}}]}
VECTOR_HEX = (
    "82a56d6f64656ca16da56974656d739181a564656e736583a464696d7303a56474797065a7666c6f61743332"
    "a676616c75657385c4026e64c3c40474797065a33c6634c4046b696e64c400c40573686170659103c40464617461"
    "c40c0000003f000080bf00000040"
)
VECTOR = bytes.fromhex(VECTOR_HEX)
VALUES = np.array([0.5, -1.0, 2.0], dtype=np.float32)


def vector_object() -> dict:
    return {"model": "m", "items": [{"dense": {"dims": 3, "dtype": "float32", "values": VALUES}}]}


def test_packb_reproduces_the_numpy_vector_byte_for_byte():
    assert packb(vector_object()) == VECTOR


def test_msgpack_numpy_itself_produces_the_vector():
    # Guards the vector against a transcription error: the reference encoder gives the same bytes.
    assert msgpack_numpy.packb(vector_object()) == VECTOR


def test_encode_response_message_serializes_to_the_vector():
    response = EncodeResponse(
        model="m", items=[EncodeResult(dense=DenseEmbedding(dims=3, dtype="float32", values=VALUES))]
    )
    assert to_msgpack(response) == VECTOR


def test_vector_decodes_to_a_float32_array():
    response = from_msgpack(VECTOR, EncodeResponse)
    values = response.items[0].dense.values
    assert isinstance(values, np.ndarray)
    assert values.dtype == np.float32
    assert values.tolist() == [0.5, -1.0, 2.0]
    assert response.items[0].id is None


def test_msgpack_numpy_decodes_what_we_encode():
    decoded = msgpack_numpy.unpackb(VECTOR)
    assert np.array_equal(decoded["items"][0]["dense"]["values"], VALUES)


@pytest.mark.parametrize(
    ("array"),
    [
        np.arange(12, dtype=np.float16).reshape(3, 4),
        np.array([-3, 0, 127], dtype=np.int8),
        np.array([0, 128, 255], dtype=np.uint8),
        np.array([3034, 7, 250001], dtype=np.int32),
        np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2],  # not C-contiguous
    ],
)
def test_real_msgpack_numpy_output_decodes(array):
    decoded = unpackb(msgpack_numpy.packb({"values": array}))
    assert decoded["values"].dtype == array.dtype
    assert decoded["values"].shape == array.shape
    assert np.array_equal(decoded["values"], array)


def test_msgpack_numpy_scalar_decodes_to_a_numpy_scalar():
    decoded = unpackb(msgpack_numpy.packb({"score": np.float32(0.25)}))
    assert decoded["score"] == np.float32(0.25)
    assert decoded["score"].dtype == np.float32


def test_string_keyed_sentinel_maps_decode():
    # The Rust gateway matches str keys as well as bin keys (contracts Part B §1.9).
    body = msgpack.packb({"nd": True, "type": "<f4", "kind": "", "shape": [3], "data": VALUES.tobytes()})
    assert np.array_equal(unpackb(body), VALUES)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"items": ["just a string"]}, "Expected `object`, got `str` - at `$.items[0]`"),
        ({"items": [{"text": 123}]}, "Expected `str | null`, got `int` - at `$.items[0].text`"),
        ({"items": []}, "Expected `array` of length >= 1 - at `$.items`"),
    ],
)
def test_acceptance_7_1_item_5_messages(body, message):
    for decode, data in ((from_msgpack, msgpack.packb(body)), (from_json, json.dumps(body).encode())):
        with pytest.raises(DecodeError) as caught:
            decode(data, EncodeRequest)
        assert str(caught.value) == message


def test_acceptance_7_1_item_6_unknown_fields_are_ignored():
    body = {"items": [{"text": "Hello", "colour": "red"}], "trace": {"x": 1}, "params": {"future": True}}
    request = from_json(json.dumps(body).encode(), EncodeRequest)
    assert request.items[0].text == "Hello"


def test_acceptance_7_1_item_4_absent_ids_are_not_invented():
    result = EncodeResult(dense=DenseEmbedding(dims=3, dtype="float32", values=VALUES))
    assert "id" not in unstructure(result)


def test_ipc_error_response_has_no_kind_key():
    # contracts Part A §2.1, observed error envelope.
    expected = {"version": 1, "request_id": "ipc-7", "ok": False, "body": None, "error": "unknown method NoSuchMethod"}
    response = IpcResponse(request_id="ipc-7", ok=False, error="unknown method NoSuchMethod")
    assert unstructure(response) == expected
    assert list(unstructure(response)) == list(expected)
    assert structure(msgpack.unpackb(msgpack.packb(expected)), IpcResponse) == response


def test_observed_minilm_ensure_model_ready_response_decodes():
    observed = {
        "state": "ready",
        "batch_budget": 64,
        "descriptor": {
            "tokenizer_path": None,
            "tokenizer_id": None,
            "max_seq_len": None,
            "output_types": [],
            "supports_run_batch": True,
            "default_query_template": None,
            "default_doc_template": None,
            "max_concurrent_dispatch": 1,
        },
    }
    response = from_msgpack(msgpack.packb(observed), EnsureModelReadyResponse)
    assert response.batch_budget == 64
    assert response.descriptor.supports_run_batch is True
    assert unstructure(response) == observed


def test_work_item_example_from_part_b_4_1_decodes():
    example = {
        "work_item_id": "0190f-7a.1",
        "request_id": "0190f-7a",
        "item_index": 1,
        "total_items": 2,
        "operation": "encode",
        "model_id": "BAAI/bge-m3",
        "profile_id": "default",
        "pool_name": "default",
        "machine_profile": "l4",
        "item": {"text": "World"},
        "payload_ref": None,
        "output_types": ["dense"],
        "instruction": None,
        "is_query": False,
        "options": {"is_query": False},
        "query_item": None,
        "query_payload_ref": None,
        "score_items": None,
        "labels": None,
        "output_schema": None,
        "bundle_config_hash": "9038d73c",
        "router_id": "gw-1",
        "reply_subject": "_INBOX.gw-1.0190f-7a",
        "timestamp": 1760000000.12,
    }
    item = from_msgpack(msgpack.packb(example), WorkItem)
    assert item.item == {"text": "World"}
    assert item.reply_subject == "_INBOX.gw-1.0190f-7a"
    # Written back, the nulls are omitted and every present value survives.
    assert unstructure(item) == {key: value for key, value in example.items() if value is not None} | {
        "accepts_result_chunks": False
    }
