"""Strict structuring, error translation and writer rules of the one converter (sie.wire.converter)."""

import base64

import attrs
import numpy as np
import pytest

from sie.wire.config import ConfigNotification
from sie.wire.converter import from_msgpack, structure, to_msgpack, unstructure
from sie.wire.errors import DecodeError
from sie.wire.http import DenseEmbedding, EncodeParams, EncodeRequest, ImageInput, Item
from sie.wire.ipc import IpcRequest, IpcResponseChunkV1
from sie.wire.ipc_batch import DenseRaw, PreparedTokens, RawOutput
from sie.wire.ipc_control import DrainRequest, PingResponse, SetPinnedModelsResponse
from sie.wire.queue import WorkResult


def decode_error(data, cls) -> DecodeError:
    with pytest.raises(DecodeError) as caught:
        structure(data, cls)
    return caught.value


@pytest.mark.parametrize(
    ("data", "cls", "message"),
    [
        ({"timestamp_ms": 1.0, "worker_id": 7}, PingResponse, "Expected `str`, got `int` - at `$.worker_id`"),
        ({"timestamp_ms": "1", "worker_id": "w"}, PingResponse, "Expected `float`, got `str` - at `$.timestamp_ms`"),
        ({"timestamp_ms": True, "worker_id": "w"}, PingResponse, "Expected `float`, got `bool` - at `$.timestamp_ms`"),
        (
            {"timestamp_ms": 1.0, "worker_id": "w", "ready": 1},
            PingResponse,
            "Expected `bool`, got `int` - at `$.ready`",
        ),
        (
            {"timestamp_ms": 1.0, "worker_id": "w", "loaded_models": "m"},
            PingResponse,
            "Expected `array`, got `str` - at `$.loaded_models`",
        ),
        (
            {"timestamp_ms": 1.0, "worker_id": "w", "loaded_models": ["a", None]},
            PingResponse,
            "Expected `str`, got `null` - at `$.loaded_models[1]`",
        ),
        (
            {"input_ids": [[1, 2], [3, 2.0]], "tokenizer_id": "t"},
            PreparedTokens,
            "Expected `int`, got `float` - at `$.input_ids[1][1]`",
        ),
        ({"deadline_ms": True}, DrainRequest, "Expected `float | null`, got `bool` - at `$.deadline_ms`"),
        (
            {"work_item_id": "w", "request_id": "r", "item_index": 0, "success": True, "result_msgpack": "text"},
            WorkResult,
            "Expected `bytes | null`, got `str` - at `$.result_msgpack`",
        ),
        (
            {"items": [{"text": "a", "metadata": []}]},
            EncodeRequest,
            "Expected `object | null`, got `array` - at `$.items[0].metadata`",
        ),
        ({"items": [{}], "params": "p"}, EncodeRequest, "Expected `object | null`, got `str` - at `$.params`"),
        ([1], EncodeRequest, "Expected `object`, got `array`"),
    ],
)
def test_wrong_types_raise_msgspec_style_messages(data, cls, message):
    assert str(decode_error(data, cls)) == message


def test_no_silent_coercion_of_numbers_to_strings():
    # cattrs' default would turn 123 into "123"; the wire must not.
    assert decode_error({"items": [{"id": 123}]}, EncodeRequest).path == "$.items[0].id"


def test_integers_are_accepted_where_floats_are_expected():
    ping = structure({"timestamp_ms": 5, "worker_id": "w"}, PingResponse)
    assert ping.timestamp_ms == 5.0
    assert type(ping.timestamp_ms) is float


def test_floats_are_not_accepted_where_integers_are_expected():
    error = decode_error({"applied": True, "pinned_count": 1.0}, SetPinnedModelsResponse)
    assert str(error) == "Expected `int`, got `float` - at `$.pinned_count`"


def test_missing_required_fields_are_named_at_the_enclosing_object():
    assert str(decode_error({}, EncodeRequest)) == "Object missing required field `items`"
    error = decode_error({"items": [{"images": [{"format": "png"}]}]}, EncodeRequest)
    assert str(error) == "Object missing required field `data` - at `$.items[0].images[0]`"


def test_unknown_fields_are_ignored_at_every_level():
    request = structure(
        {"items": [{"text": "a", "new": 1}], "params": {"output_dtype": "int8", "later": {}}, "top": [1]},
        EncodeRequest,
    )
    assert request == EncodeRequest(items=[Item(text="a")], params=EncodeParams(output_dtype="int8"))


def test_map_keys_must_be_strings():
    error = decode_error({"items": [{"metadata": {1: "x"}}]}, EncodeRequest)
    assert str(error) == "Expected `str` keys, got `int` - at `$.items[0].metadata`"


def test_nested_map_values_are_checked_with_their_key_in_the_path():
    data = _notification() | {"bundle_pool_config_hashes": {"default": {"gpu": 3}}}
    error = decode_error(data, ConfigNotification)
    assert str(error) == "Expected `str`, got `int` - at `$.bundle_pool_config_hashes.default.gpu`"


def test_tuples_are_accepted_as_arrays():
    assert structure({"models": ("a", "b")}, _Models).models == ["a", "b"]


def test_top_level_lists_of_messages_report_the_index():
    with pytest.raises(DecodeError) as caught:
        structure([{"text": "a"}, "b"], list[Item])
    assert str(caught.value) == "Expected `object`, got `str` - at `$[1]`"


def test_media_bytes_accept_base64_strings_from_json_bodies():
    encoded = base64.b64encode(b"\xff\xd8jpeg").decode()
    request = structure({"items": [{"images": [{"data": encoded, "format": "jpeg"}]}]}, EncodeRequest)
    assert request.items[0].images[0].data == b"\xff\xd8jpeg"


def test_invalid_base64_media_is_a_decode_error():
    error = decode_error({"items": [{"images": [{"data": "%%%"}]}]}, EncodeRequest)
    assert error.path == "$.items[0].images[0].data"
    assert error.message.startswith("Invalid base64 data")


def test_bytes_fields_take_msgpack_bin_and_stay_bytes():
    chunk = IpcResponseChunkV1(
        request_id="r",
        transfer_digest=bytes(32),
        chunk_index=0,
        chunk_count=1,
        total_bytes=3,
        payload=b"abc",
    )
    decoded = from_msgpack(to_msgpack(chunk), IpcResponseChunkV1)
    assert decoded == chunk
    assert type(decoded.payload) is bytes


def test_bytes_fields_accept_bytearray_and_memoryview():
    data = {"work_item_id": "w", "request_id": "r", "item_index": 0, "success": True}
    assert structure(data | {"result_msgpack": bytearray(b"x")}, WorkResult).result_msgpack.packed() == b"x"
    assert structure(data | {"result_msgpack": memoryview(b"y")}, WorkResult).result_msgpack.packed() == b"y"


def test_ndarray_fields_pass_through_untouched():
    values = np.array([1.0, 2.0], dtype=np.float16)
    dense = structure({"dims": 2, "dtype": "float16", "values": values}, DenseEmbedding)
    assert dense.values is values
    assert unstructure(dense)["values"] is values


def test_float32_array_fields_keep_float32_arrays_and_convert_lists():
    values = np.array([0.5, 1.5], dtype=np.float32)
    assert structure({"values": values, "dim": 2}, DenseRaw).values is values
    from_list = structure({"values": [0.5, 1.5], "dim": 2}, DenseRaw).values
    assert from_list.dtype == np.float32
    assert from_list.tolist() == [0.5, 1.5]


def test_array_field_rejects_non_arrays():
    assert str(decode_error({"values": "abc", "dim": 1}, DenseRaw)) == "Expected `array`, got `str` - at `$.values`"


def test_rule_violations_are_decode_errors_at_the_object():
    error = decode_error({}, RawOutput)
    assert error.message == "RawOutput must set exactly one of dense, score, sparse, multivector"


def test_writer_omits_none_valued_omittable_fields_only():
    assert unstructure(EncodeRequest(items=[Item(text="a")])) == {"items": [{"text": "a"}]}
    # IPC envelopes carry every field, like msgspec.to_builtins.
    assert unstructure(IpcRequest(request_id="r", method="Ping", body={})) == {
        "version": 1,
        "request_id": "r",
        "method": "Ping",
        "body": {},
        "accepts_ipc_response_chunks_v1": False,
    }


def test_writer_emits_known_fields_only():
    request = structure({"items": [{"text": "a", "unknown": 1}], "unknown": 2}, EncodeRequest)
    assert unstructure(request) == {"items": [{"text": "a"}]}


def test_image_inputs_unstructure_to_maps():
    item = Item(images=[ImageInput(data=b"\x01", format="png")])
    assert unstructure(item) == {"images": [{"data": b"\x01", "format": "png"}]}


def test_errors_that_are_bugs_are_not_turned_into_decode_errors():
    with pytest.raises(RuntimeError, match="bug"):
        structure({"value": "x"}, _Broken)


def test_config_notification_accepts_producer_id_for_router_id():
    data = _notification()
    data["producer_id"] = data.pop("router_id")
    assert structure(data, ConfigNotification).router_id == "sie-config-0"
    assert structure(_notification() | {"producer_id": "other"}, ConfigNotification).router_id == "sie-config-0"


@attrs.frozen(kw_only=True)
class _Models:
    models: list[str]


@attrs.frozen(kw_only=True)
class _Broken:
    value: str

    def __attrs_post_init__(self) -> None:
        raise RuntimeError("a bug, not bad input")


def _notification() -> dict:
    return {
        "router_id": "sie-config-0",
        "bundle_id": "default",
        "epoch": 3,
        "bundle_config_hash": "ab" * 32,
        "model_id": "BAAI/bge-m3",
        "model_config": "sie_id: BAAI/bge-m3\n",
    }
