"""msgpack and JSON bytes (sie.wire.codec)."""

import sys

import msgpack
import numpy as np
import pytest

from sie.wire.codec import dumps_json, loads_json, packb, unpackb
from sie.wire.errors import DecodeError, EncodeError


def test_msgpack_round_trip_keeps_bytes_arrays_and_scalars():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    data = {"blob": b"\x00\xff", "values": array, "n": 3, "x": 1.5, "none": None, "flag": True, "list": ["a"]}
    decoded = unpackb(packb(data))
    assert decoded["blob"] == b"\x00\xff"
    assert isinstance(decoded["blob"], bytes)
    assert np.array_equal(decoded["values"], array)
    assert decoded["values"].dtype == np.float32
    assert {key: decoded[key] for key in ("n", "x", "none", "flag", "list")} == {
        "n": 3,
        "x": 1.5,
        "none": None,
        "flag": True,
        "list": ["a"],
    }


def test_bytes_are_msgpack_bin():
    assert packb(b"ab") == b"\xc4\x02ab"


def test_numpy_scalars_become_plain_numbers():
    assert msgpack.unpackb(packb({"score": np.float32(0.5), "rank": np.int64(2)})) == {"score": 0.5, "rank": 2}


def test_decoded_arrays_are_read_only_views():
    decoded = unpackb(packb(np.array([1.0, 2.0], dtype=np.float32)))
    assert not decoded.flags.writeable


def test_unpackb_accepts_memoryview_and_bytearray():
    body = packb({"a": 1})
    assert unpackb(memoryview(body)) == {"a": 1}
    assert unpackb(bytearray(body)) == {"a": 1}


@pytest.mark.parametrize(
    "body",
    [
        b"",  # empty body
        b"\xc1",  # reserved type byte
        b"\x92\x01",  # array header promises two elements, one present
        b"\xd4\x4e\x01",  # ext type 78: not part of our wire
        "not bytes",
    ],
)
def test_malformed_msgpack_raises_decode_error(body):
    with pytest.raises(DecodeError) as caught:
        unpackb(body)
    assert caught.value.message.startswith("MessagePack data is malformed: ")
    assert caught.value.path == "$"


def test_nesting_deeper_than_the_stack_left_is_a_decode_error():
    """A handler runs some frames deep: a body ormsgpack accepts (1000 nested arrays, under its own limit) must still
    be refused as malformed there, never escape as a RecursionError (the fuzz test met it as a 500)."""
    nested = b"\x91" * 1000 + b"\xc0"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(600)  # less stack than the nesting needs, as on a deep handler
    try:
        with pytest.raises(DecodeError, match="nested too deeply"):
            unpackb(nested)
    finally:
        sys.setrecursionlimit(limit)


def test_unserializable_value_raises_encode_error():
    with pytest.raises(EncodeError):
        packb({"x": object()})
    with pytest.raises(EncodeError):
        packb({"x": np.array([object()])})


def test_encode_error_is_a_type_error():
    # A value without a wire form is a programmer error, so callers treating TypeError as a bug still do.
    with pytest.raises(TypeError):
        packb(object())


def test_dumps_json_writes_arrays_as_lists():
    body = dumps_json({"values": np.array([0.5, -1.0, 2.0], dtype=np.float32), "n": np.int32(3)})
    assert body == b'{"values":[0.5,-1.0,2.0],"n":3}'


def test_dumps_json_writes_float16_as_float32_numbers():
    assert dumps_json(np.array([0.1, 1.0], dtype=np.float16)) == b"[0.099975586,1.0]"


@pytest.mark.parametrize(
    "array",
    [
        np.arange(6, dtype=np.float32).reshape(2, 3)[:, :2],  # not contiguous
        np.array([1.5, 2.5], dtype=">f4"),  # not native byte order
    ],
)
def test_dumps_json_handles_arrays_orjson_refuses(array):
    assert loads_json(dumps_json({"v": array})) == {"v": array.tolist()}


def test_dumps_json_rejects_bytes():
    # JSON has no binary type; bytes belong on msgpack bodies only.
    with pytest.raises(EncodeError):
        dumps_json({"data": b"\x00"})


def test_loads_json_round_trip():
    assert loads_json(b'{"a":[1,2.5,null,"x"]}') == {"a": [1, 2.5, None, "x"]}


@pytest.mark.parametrize("body", [b"", b"{", b'{"a":}', b"\xff"])
def test_malformed_json_raises_decode_error(body):
    with pytest.raises(DecodeError) as caught:
        loads_json(body)
    assert caught.value.message.startswith("JSON is malformed: ")
