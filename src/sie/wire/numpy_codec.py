"""The msgpack-numpy sentinel map: how an ndarray travels inside msgpack (contracts Part B §1.9).

Converts between ndarrays and `{nd, type, kind, shape, data}` maps, walks decoded structures, and
makes structures JSON-ready. It never touches msgpack bytes itself; codec.py does that.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sie.wire.errors import DecodeError, EncodeError

# Binary keys, as msgpack-numpy writes them with use_bin_type=True; the key order is part of the
# byte-exact vector in contracts §1.9.
_BIN_KEYS = (b"nd", b"type", b"kind", b"shape", b"data")
_STR_KEYS = ("nd", "type", "kind", "shape", "data")


def array_to_map(array: np.ndarray) -> dict[bytes, Any]:
    """Return the sentinel map msgpack-numpy would write for `array` (C-order bytes, no copy if possible)."""
    if array.dtype.kind in "OV":
        raise EncodeError(f"arrays of dtype {array.dtype} have no wire form; use a plain numeric dtype")
    # A contiguous array is handed over as a memoryview, so ormsgpack copies its bytes exactly once.
    data = array.data if array.flags.c_contiguous else array.tobytes()
    return {b"nd": True, b"type": array.dtype.str, b"kind": b"", b"shape": list(array.shape), b"data": data}


def is_array_map(obj: dict[Any, Any]) -> bool:
    """True when `obj` is a sentinel map, with binary keys or with string keys."""
    if b"nd" in obj:
        return True
    # String keys also occur in ordinary user maps, so demand the whole key set before claiming one.
    return "nd" in obj and "type" in obj and "data" in obj


def map_to_array(obj: dict[Any, Any]) -> np.ndarray | np.generic:
    """Decode one sentinel map; the array shares memory with the map's `data` bytes (read-only)."""
    nd, descr, kind, shape, data = _fields(obj)
    if kind not in (b"", ""):
        raise DecodeError(f"Unsupported ndarray kind {kind!r}; only plain numeric dtypes are accepted")
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError(f"Expected `bytes` for ndarray data, got `{type(data).__name__}`")
    try:
        dtype = np.dtype(descr)
        flat = np.frombuffer(data, dtype=dtype)
        if nd is not True:
            return flat[0]
        return flat.reshape(shape)
    except (TypeError, ValueError, IndexError) as exc:
        raise DecodeError(f"Invalid ndarray map: {exc}") from exc


def _fields(obj: dict[Any, Any]) -> tuple[Any, ...]:
    keys = _BIN_KEYS if b"nd" in obj else _STR_KEYS
    nd, descr, kind, shape, data = (obj.get(key) for key in keys)
    if nd is True and not isinstance(shape, list | tuple):
        raise DecodeError(f"Expected `array` for ndarray shape, got `{type(shape).__name__}`")
    return nd, descr, b"" if kind is None else kind, shape, data


def decode_arrays(obj: Any) -> Any:
    """Replace every sentinel map inside a decoded structure by its ndarray; dicts and lists change in place."""
    if isinstance(obj, dict):
        if is_array_map(obj):
            return map_to_array(obj)
        for key, value in obj.items():
            if isinstance(value, dict | list):
                try:
                    obj[key] = decode_arrays(value)
                except DecodeError as exc:
                    raise _nested(exc, f".{key}") from exc
    elif isinstance(obj, list):
        for index, value in enumerate(obj):
            if isinstance(value, dict | list):
                try:
                    obj[index] = decode_arrays(value)
                except DecodeError as exc:
                    raise _nested(exc, f"[{index}]") from exc
    return obj


def _nested(exc: DecodeError, segment: str) -> DecodeError:
    return DecodeError(exc.message, "$" + segment + exc.path[1:])


def array_to_list(array: np.ndarray) -> list[Any]:
    """Return `array` as nested lists; float16 becomes float32 first, as the gateway's JSON does."""
    if array.dtype == np.float16:
        array = array.astype(np.float32)
    return array.tolist()


def to_jsonable(obj: Any) -> Any:
    """Return a copy of `obj` with ndarrays, numpy scalars and sentinel maps turned into plain numbers and lists."""
    if isinstance(obj, np.ndarray):
        return array_to_list(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        if is_array_map(obj):
            return to_jsonable(map_to_array(obj))
        return {key: to_jsonable(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(value) for value in obj]
    return obj
