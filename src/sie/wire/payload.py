"""A work result's public body as it travels (the `result_msgpack` field of ItemOutcome and WorkResult): a
value inside one process, msgpack bytes across the IPC and NATS edges, and each made from the other at most
once.

The worker makes a body from its result object and the gateway reads that object back; only the converter's
writer (at an IPC or NATS edge) packs it, and a body the converter's reader made from bytes is unpacked only
when someone asks for its value. In `--role all` nothing packs or unpacks it (DESIGN.md §7).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sie.wire.codec import packb, unpackb

_UNSET: Any = object()
# What msgpack adds around a scalar or a container entry, for size estimates of unpacked values.
_ENTRY_OVERHEAD = 9


class ResultBody:
    """One result body: its value, its msgpack bytes, or both once either was derived (never twice)."""

    __slots__ = ("_packed", "_value")

    def __init__(self, value: Any = _UNSET, packed: bytes | None = None) -> None:
        if value is _UNSET and packed is None:
            raise ValueError("a ResultBody needs a value or its packed bytes")
        self._value = value
        self._packed = packed

    @classmethod
    def of(cls, value: Any) -> ResultBody:
        """A body made from a result object (plain data with ndarrays), packed only if it crosses an edge."""
        return cls(value=value)

    @classmethod
    def from_packed(cls, packed: bytes) -> ResultBody:
        """A body that arrived as msgpack bytes, unpacked only when its value is read."""
        return cls(packed=packed)

    @property
    def value(self) -> Any:
        """The result object; bytes that arrived are unpacked once (DecodeError when they are not msgpack)."""
        if self._value is _UNSET:
            self._value = unpackb(self._packed)  # type: ignore[arg-type]  # set whenever the value is not
        return self._value

    def packed(self) -> bytes:
        """The msgpack bytes; a value is packed once (EncodeError when it is not plain data)."""
        if self._packed is None:
            self._packed = packb(self._value)
        return self._packed

    def size_hint(self) -> int:
        """About how many bytes the body takes on the wire, without packing it: exact once packed."""
        if self._packed is not None:
            return len(self._packed)
        return _estimate(self._value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ResultBody):
            return NotImplemented
        return self.packed() == other.packed()

    def __hash__(self) -> int:
        return hash(self.packed())

    def __repr__(self) -> str:
        shown = f"{len(self._packed)} packed bytes" if self._value is _UNSET else repr(self._value)
        return f"ResultBody({shown})"


def _estimate(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes + 4 * _ENTRY_OVERHEAD
    if isinstance(value, dict):
        return sum(_estimate(key) + _estimate(item) for key, item in value.items()) + _ENTRY_OVERHEAD
    if isinstance(value, list | tuple):
        return sum(_estimate(item) for item in value) + _ENTRY_OVERHEAD
    if isinstance(value, str | bytes):
        return len(value) + _ENTRY_OVERHEAD
    return _ENTRY_OVERHEAD


def result_body(value: ResultBody | bytes | bytearray | memoryview | None) -> ResultBody | None:
    """The attrs converter of `result_msgpack` fields: packed bytes given to a constructor become a body."""
    if value is None or isinstance(value, ResultBody):
        return value
    return ResultBody.from_packed(bytes(value))
