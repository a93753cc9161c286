"""Sentinel-map conversion of ndarrays (sie.wire.numpy_codec)."""

import numpy as np
import pytest

from sie.wire.errors import DecodeError, EncodeError
from sie.wire.numpy_codec import (
    array_to_list,
    array_to_map,
    decode_arrays,
    is_array_map,
    map_to_array,
    to_jsonable,
)


def test_array_to_map_writes_binary_keys_in_msgpack_numpy_order():
    array = np.array([[1, 2], [3, 4]], dtype=np.int32)
    sentinel = array_to_map(array)
    assert list(sentinel) == [b"nd", b"type", b"kind", b"shape", b"data"]
    assert sentinel[b"nd"] is True
    assert sentinel[b"type"] == "<i4"
    assert sentinel[b"kind"] == b""
    assert sentinel[b"shape"] == [2, 2]
    assert bytes(sentinel[b"data"]) == array.tobytes()


def test_array_to_map_copies_non_contiguous_arrays_in_c_order():
    array = np.arange(12, dtype=np.float32).reshape(3, 4).T
    sentinel = array_to_map(array)
    assert sentinel[b"shape"] == [4, 3]
    assert sentinel[b"data"] == np.ascontiguousarray(array).tobytes()


@pytest.mark.parametrize("array", [np.array([object()]), np.zeros(2, dtype=[("a", "<f4")])])
def test_object_and_structured_arrays_have_no_wire_form(array):
    with pytest.raises(EncodeError):
        array_to_map(array)


def test_map_to_array_round_trips_dtype_and_shape():
    array = np.arange(6, dtype=np.float16).reshape(2, 3)
    decoded = map_to_array(_bytes_map(array))
    assert decoded.dtype == np.float16
    assert decoded.shape == (2, 3)
    assert np.array_equal(decoded, array)


def test_map_to_array_shares_memory_with_the_data_buffer():
    data = bytearray(np.array([1.0, 2.0], dtype=np.float32).tobytes())
    decoded = map_to_array({b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [2], b"data": data})
    data[0:4] = np.array([9.0], dtype=np.float32).tobytes()
    assert decoded[0] == 9.0


def test_map_to_array_accepts_string_keys():
    array = np.array([1, 2, 3], dtype=np.uint8)
    sentinel = {"nd": True, "type": "|u1", "kind": "", "shape": [3], "data": array.tobytes()}
    assert np.array_equal(map_to_array(sentinel), array)


def test_map_to_array_decodes_a_scalar_map():
    sentinel = {b"nd": False, b"type": "<f4", b"data": np.float32(1.5).tobytes()}
    assert map_to_array(sentinel) == np.float32(1.5)


@pytest.mark.parametrize(
    ("sentinel", "message"),
    [
        ({b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [3], b"data": b"\x00" * 4}, "Invalid ndarray map"),
        ({b"nd": True, b"type": "nonsense", b"kind": b"", b"shape": [1], b"data": b"\x00" * 4}, "Invalid ndarray"),
        ({b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [1], b"data": "text"}, "Expected `bytes`"),
        ({b"nd": True, b"type": "<f4", b"kind": b"", b"shape": 1, b"data": b"\x00" * 4}, "Expected `array`"),
        # Object arrays would need pickle; never unpickle wire data.
        ({b"nd": True, b"type": "|O", b"kind": b"O", b"shape": [1], b"data": b"x"}, "Unsupported ndarray kind"),
        ({b"nd": True, b"type": "|O", b"kind": b"", b"shape": [1], b"data": b"\x00" * 8}, "Invalid ndarray map"),
    ],
)
def test_map_to_array_rejects_broken_maps(sentinel, message):
    with pytest.raises(DecodeError, match=message):
        map_to_array(sentinel)


def test_is_array_map_needs_the_whole_key_set_for_string_keys():
    assert is_array_map({b"nd": True})
    assert is_array_map({"nd": True, "type": "<f4", "data": b""})
    assert not is_array_map({"nd": "a user field", "label": "x"})


def test_decode_arrays_replaces_nested_maps_in_place():
    array = np.array([0.5, -1.0], dtype=np.float32)
    structure = {"items": [{"dense": {"values": _bytes_map(array)}}], "plain": {"nd": 1}}
    decoded = decode_arrays(structure)
    assert decoded is structure
    assert np.array_equal(structure["items"][0]["dense"]["values"], array)
    assert structure["plain"] == {"nd": 1}


def test_decode_arrays_reports_the_path_of_a_broken_map():
    broken = {b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [3], b"data": b"\x00"}
    with pytest.raises(DecodeError) as caught:
        decode_arrays({"items": [{"dense": {"values": broken}}]})
    assert caught.value.path == "$.items[0].dense.values"


def test_decode_arrays_returns_a_top_level_array():
    array = np.array([7], dtype=np.int8)
    assert np.array_equal(decode_arrays(_bytes_map(array)), array)


def test_array_to_list_widens_float16_to_float32_values():
    values = array_to_list(np.array([0.1, 1.0], dtype=np.float16))
    assert values == [float(np.float32(np.float16(0.1))), 1.0]


def test_to_jsonable_converts_arrays_scalars_and_sentinel_maps():
    array = np.array([[1, 2]], dtype=np.int32)
    converted = to_jsonable({"a": array, "b": (np.float32(0.5),), "c": _bytes_map(array), "d": "text"})
    assert converted == {"a": [[1, 2]], "b": [0.5], "c": [[1, 2]], "d": "text"}


def _bytes_map(array: np.ndarray) -> dict:
    sentinel = array_to_map(array)
    sentinel[b"data"] = bytes(sentinel[b"data"])
    return sentinel
