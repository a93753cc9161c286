"""The one cattrs converter that maps wire data (dicts, lists, scalars) onto the frozen message classes and back.

Readers ignore unknown keys and check types strictly (no str(123)); any mismatch becomes a DecodeError
with msgspec's message and a `$` path. Writers emit known fields only and drop None-valued omittable ones.
"""

from __future__ import annotations

import base64
import binascii
import types
from collections.abc import Callable
from typing import Any, NewType, TypeVar, Union, get_args, get_origin

import attrs
import cattrs
import numpy as np
from cattrs.cols import list_structure_factory
from cattrs.errors import AttributeValidationNote, BaseValidationError, IterableValidationNote
from cattrs.fns import identity
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn

from sie.wire._fields import OMIT_IF_NONE, FieldValueError, TokenRows
from sie.wire.codec import dumps_json, loads_json, packb, unpackb
from sie.wire.config import ConfigNotification
from sie.wire.errors import DecodeError
from sie.wire.http import MediaBytes
from sie.wire.payload import ResultBody

T = TypeVar("T")

converter = cattrs.Converter()


class _Mismatch(TypeError):
    """A value of the wrong wire type; the expected type is read from the cattrs note at translation."""

    def __init__(self, value: Any) -> None:
        super().__init__(f"got {_got(value)}")
        self.value = value


# --- primitive hooks -----------------------------------------------------------------------------


def _structure_str(value: Any, _: type) -> str:
    if type(value) is not str:
        raise _Mismatch(value)
    return value


def _structure_int(value: Any, _: type) -> int:
    if type(value) is not int:
        raise _Mismatch(value)
    return value


def _structure_float(value: Any, _: type) -> float:
    # msgspec accepts an integer where a float is expected; bool is never a number on the wire.
    if type(value) is float:
        return value
    if type(value) is not int:
        raise _Mismatch(value)
    return float(value)


def _structure_bool(value: Any, _: type) -> bool:
    if type(value) is not bool:
        raise _Mismatch(value)
    return value


def _structure_bytes(value: Any, _: type) -> bytes:
    if type(value) is bytes:
        return value
    if not isinstance(value, bytearray | memoryview):
        raise _Mismatch(value)
    return bytes(value)


def _structure_media_bytes(value: Any, _: type) -> bytes:
    # JSON bodies carry media as base64 strings; the gateway decodes them at the edge (seed 000 §2).
    if type(value) is not str:
        return _structure_bytes(value, bytes)
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"Invalid base64 data: {exc}") from exc


def _structure_ndarray(value: Any, _: type) -> Any:
    # Lists are the JSON form of an array; the field's attrs converter turns them into one.
    if not isinstance(value, np.ndarray | list):
        raise _Mismatch(value)
    return value


converter.register_structure_hook(str, _structure_str)
converter.register_structure_hook(int, _structure_int)
converter.register_structure_hook(float, _structure_float)
converter.register_structure_hook(bool, _structure_bool)
converter.register_structure_hook(bytes, _structure_bytes)
converter.register_structure_hook(MediaBytes, _structure_media_bytes)
converter.register_structure_hook(np.ndarray, _structure_ndarray)
# A result body is bytes on the wire: packed here (at most once) and unpacked only when its value is read.
converter.register_structure_hook(ResultBody, lambda value, _: ResultBody.from_packed(_structure_bytes(value, bytes)))
converter.register_unstructure_hook(ResultBody, ResultBody.packed)


# Token rows are `[[int]]` on the wire, read as such; the field's attrs converter makes each row an int64 array.
converter.register_structure_hook(TokenRows, lambda value, _: converter.structure(value, list[list[int]]))
converter.register_unstructure_hook(TokenRows, lambda rows: [row.tolist() for row in rows])

# --- containers ----------------------------------------------------------------------------------

# Element types whose lists are checked with one C-level pass instead of one hook call per element.
_FAST_ELEMENT_TYPES: dict[Any, frozenset[type]] = {
    str: frozenset({str}),
    int: frozenset({int}),
    bool: frozenset({bool}),
    float: frozenset({float}),
}
_STR_ONLY = _FAST_ELEMENT_TYPES[str]


def _is_list(tp: Any) -> bool:
    return tp is list or get_origin(tp) is list


def _is_dict(tp: Any) -> bool:
    return tp is dict or get_origin(tp) is dict


def _list_hook(tp: Any) -> Callable[[Any, Any], list[Any]]:
    (elem,) = get_args(tp) or (Any,)
    if elem is Any:
        return _checked_list
    per_element = list_structure_factory(tp, converter)
    fast_types = _FAST_ELEMENT_TYPES.get(elem)

    def structure_list(value: Any, _: Any) -> list[Any]:
        if fast_types is not None and type(value) is list and set(map(type, value)) <= fast_types:
            return value
        _checked_list(value, tp)
        return per_element(value, tp)

    return structure_list


def _checked_list(value: Any, _: Any) -> list[Any]:
    if type(value) is list:
        return value
    if type(value) is not tuple:
        raise _Mismatch(value)
    return list(value)


def _dict_hook(tp: Any) -> Callable[[Any, Any], dict[Any, Any]]:
    key_type, value_type = get_args(tp) or (Any, Any)
    if value_type is Any:
        return _checked_dict
    key_hook = converter.get_structure_hook(key_type)
    value_hook = converter.get_structure_hook(value_type)

    def structure_dict(value: Any, _: Any) -> dict[Any, Any]:
        _checked_dict(value, tp)
        result = {}
        for key, item in value.items():
            try:
                result[key_hook(key, key_type)] = value_hook(item, value_type)
            except Exception as exc:
                # Only adds the key to the error's path; the error itself goes up unchanged.
                exc.add_note(AttributeValidationNote(f"Structuring {tp} @ key {key!r}", str(key), value_type))
                raise
        return result

    return structure_dict


def _checked_dict(value: Any, _: Any) -> dict[Any, Any]:
    if type(value) is not dict:
        raise _Mismatch(value)
    if not set(map(type, value)) <= _STR_ONLY:
        bad = next(key for key in value if type(key) is not str)
        raise ValueError(f"Expected `str` keys, got `{_got(bad)}`")
    return value


converter.register_structure_hook_factory(_is_list, _list_hook)
converter.register_structure_hook_factory(_is_dict, _dict_hook)

# --- attrs classes -------------------------------------------------------------------------------


def _class_hook(cls: type) -> Callable[[Any, Any], Any]:
    generated = make_dict_structure_fn(cls, converter)

    def structure_class(value: Any, _: Any) -> Any:
        if type(value) is not dict:
            raise _Mismatch(value)
        return generated(value, cls)

    return structure_class


def _class_unstructure_hook(cls: type) -> Callable[[Any], dict[str, Any]]:
    generated = make_dict_unstructure_fn(cls, converter)
    omitted = tuple(field.name for field in attrs.fields(cls) if field.metadata.get(OMIT_IF_NONE))
    if not omitted:
        return generated

    def unstructure_class(obj: Any) -> dict[str, Any]:
        result = generated(obj)
        for name in omitted:
            if result[name] is None:
                del result[name]
        return result

    return unstructure_class


converter.register_structure_hook_factory(attrs.has, _class_hook)
converter.register_unstructure_hook_factory(attrs.has, _class_unstructure_hook)


def _is_plain(tp: Any) -> bool:
    """True for types whose values are already wire data, so unstructuring can hand them over as they are."""
    if attrs.has(tp):
        return False
    return all(_is_plain(arg) for arg in get_args(tp))


converter.register_unstructure_hook_func(lambda tp: (_is_list(tp) or _is_dict(tp)) and _is_plain(tp), identity)
converter.register_unstructure_hook(np.ndarray, identity)


_structure_config_notification_fields = _class_hook(ConfigNotification)


def _structure_config_notification(value: Any, cls: Any) -> ConfigNotification:
    # The Rust gateway names router_id `producer_id`; both parse (seed 000 §8.3).
    if type(value) is dict and "router_id" not in value and "producer_id" in value:
        value = {**value, "router_id": value["producer_id"]}
    return _structure_config_notification_fields(value, cls)


converter.register_structure_hook(ConfigNotification, _structure_config_notification)

# --- errors --------------------------------------------------------------------------------------

_GOT_NAMES: dict[type, str] = {
    type(None): "null",
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    bytes: "bytes",
    bytearray: "bytes",
    memoryview: "bytes",
    list: "array",
    tuple: "array",
    dict: "object",
    np.ndarray: "array",
}
_EXPECTED_NAMES: dict[Any, str] = {
    str: "str",
    int: "int",
    float: "float",
    bool: "bool",
    bytes: "bytes",
    type(None): "null",
    np.ndarray: "array",
    ResultBody: "bytes",
    Any: "any",
}


def _got(value: Any) -> str:
    return _GOT_NAMES.get(type(value), type(value).__name__)


def _expected(tp: Any) -> str:
    """msgspec's name for a declared type: `str | null`, `array`, `object`."""
    if tp in _EXPECTED_NAMES:
        return _EXPECTED_NAMES[tp]
    if isinstance(tp, NewType):
        return _expected(tp.__supertype__)
    if get_origin(tp) in (Union, types.UnionType):
        return " | ".join(_expected(arg) for arg in get_args(tp))
    if _is_list(tp):
        return "array"
    if _is_dict(tp) or attrs.has(tp):
        return "object"
    return getattr(tp, "__name__", str(tp))


def _segment(note: str) -> str:
    if isinstance(note, AttributeValidationNote):
        return f".{note.name}"
    if isinstance(note, IterableValidationNote):
        return f"[{note.index}]"
    return ""


def _leaf(exc: BaseException, cls: Any) -> tuple[BaseException, list[str], Any]:
    """Follow the first error down a cattrs error tree: the leaf, its path segments and its declared type."""
    segments: list[str] = []
    declared = cls
    while True:
        # cattrs appends a note at each level the error passes, innermost first.
        notes = [note for note in getattr(exc, "__notes__", ()) if _segment(note)]
        segments.extend(_segment(note) for note in reversed(notes))
        if notes:
            declared = notes[0].type
        if not isinstance(exc, BaseValidationError):
            return exc, segments, declared
        exc = exc.exceptions[0]


def to_decode_error(exc: BaseException, cls: Any) -> DecodeError | None:
    """Translate a structuring failure into DecodeError; None when it is not the input's fault (a bug)."""
    leaf, segments, declared = _leaf(exc, cls)
    path = "$" + "".join(segments)
    if isinstance(leaf, _Mismatch):
        return DecodeError(f"Expected `{_expected(declared)}`, got `{_got(leaf.value)}`", path)
    if isinstance(leaf, FieldValueError):
        return DecodeError(leaf.message, f"{path}.{leaf.field}")
    if isinstance(leaf, KeyError):
        # The note names the missing field itself; msgspec reports it at the enclosing object.
        return DecodeError(f"Object missing required field `{leaf.args[0]}`", "$" + "".join(segments[:-1]))
    if isinstance(leaf, ValueError | TypeError):
        return DecodeError(str(leaf), path)
    return None


# --- public helpers ------------------------------------------------------------------------------


def structure(data: Any, cls: type[T]) -> T:
    """Build a `cls` message from decoded wire data; a wrong or missing field raises DecodeError."""
    try:
        return converter.structure(data, cls)
    except (BaseValidationError, TypeError, ValueError, KeyError) as exc:
        error = to_decode_error(exc, cls)
        if error is None:
            # Not the input's fault: surface the original exception, not cattrs' group around it.
            raise _leaf(exc, cls)[0] from None
        raise error from exc


def unstructure(obj: Any) -> Any:
    """Turn a message (or a list of them) into wire data: dicts, lists, scalars, bytes and ndarrays."""
    return converter.unstructure(obj)


def to_msgpack(obj: Any) -> bytes:
    """Serialize a message to msgpack bytes."""
    return packb(converter.unstructure(obj))


def from_msgpack(data: bytes | bytearray | memoryview, cls: type[T]) -> T:
    """Decode msgpack bytes into a `cls` message; anything wrong raises DecodeError."""
    return structure(unpackb(data), cls)


def to_json(obj: Any) -> bytes:
    """Serialize a message to JSON bytes (ndarrays become arrays)."""
    return dumps_json(converter.unstructure(obj))


def from_json(data: bytes | bytearray | memoryview | str, cls: type[T]) -> T:
    """Decode JSON bytes into a `cls` message; anything wrong raises DecodeError."""
    return structure(loads_json(data), cls)
