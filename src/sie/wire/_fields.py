"""Field helpers shared by the message modules: omitted-when-None fields, array fields, validators.

The converter reads the metadata written here; message modules never (un)structure anything.
"""

from __future__ import annotations

from typing import Any, NewType

import attrs
import numpy as np

# Ragged token id rows: int64 arrays in Python, `[[int]]` on the wire (contracts Part A §2.1 PreparedTokens).
TokenRows = NewType("TokenRows", list)

# Field metadata key: the writer leaves the field out while its value is None.
OMIT_IF_NONE = "sie.wire.omit_if_none"


class FieldValueError(ValueError):
    """A well-typed value that breaks a rule of its field (the converter reports it at the field's path)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def omittable(converter: Any = None) -> Any:
    """An optional field, None by default, that the writer leaves out while it is None."""
    return attrs.field(default=None, converter=converter, metadata={OMIT_IF_NONE: True})


def _array_eq(left: Any, right: Any) -> bool:
    return bool(np.array_equal(left, right))


def _numbers(value: Any, dtype: Any = None) -> np.ndarray:
    """`value` as an ndarray; a ragged or non-numeric list is the caller's mistake, said without numpy's words."""
    try:
        converted = np.asarray(value, dtype=dtype)
    except (ValueError, TypeError, OverflowError):
        raise ValueError("Expected a rectangular array of numbers") from None
    if converted.dtype.kind not in "biuf":
        raise ValueError("Expected a rectangular array of numbers")
    return converted


def _as_array(value: Any) -> Any:
    return value if value is None or isinstance(value, np.ndarray) else _numbers(value)


def _as_float32(value: Any) -> Any:
    return value if value is None else _numbers(value, np.float32)


def _as_int32(value: Any) -> Any:
    return value if value is None else _numbers(value, np.int32)


_CONVERTERS = {None: _as_array, "float32": _as_float32, "int32": _as_int32}


def array(dtype: str | None = None, *, default: Any = attrs.NOTHING, omit: bool = False) -> Any:
    """An ndarray field: lists (the JSON form) become arrays, cast to `dtype` when given; compared by value.

    With `omit`, the writer leaves the field out while it is None, like `omittable`.
    """
    return attrs.field(
        default=default,
        converter=_CONVERTERS[dtype],
        eq=attrs.cmp_using(eq=_array_eq),
        metadata={OMIT_IF_NONE: True} if omit else {},
    )


def _as_int64(row: Any) -> np.ndarray:
    return row if isinstance(row, np.ndarray) and row.dtype == np.int64 else np.asarray(row, dtype=np.int64)


def _as_token_rows(value: Any) -> list[np.ndarray]:
    return [_as_int64(row) for row in value]


def _token_rows_equal(left: list[np.ndarray], right: list[np.ndarray]) -> bool:
    return len(left) == len(right) and all(np.array_equal(a, b) for a, b in zip(left, right, strict=True))


def token_rows() -> Any:
    """A TokenRows field (empty by default): rows become int64 arrays as the message is built, and the
    converter writes them as lists of ints, so only the IPC edge pays for the list form."""
    return attrs.field(factory=list, converter=_as_token_rows, eq=attrs.cmp_using(eq=_token_rows_equal))


def non_empty(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    """Validator: the list must hold at least one element (msgspec's min_length=1 message)."""
    if len(value) == 0:
        raise FieldValueError("Expected `array` of length >= 1", attribute.name)
