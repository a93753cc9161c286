"""A GGUF file (llama.cpp's format) read with the pure-Python `gguf` package: metadata values and tensors
dequantized to float32 in Hugging Face `[out_features, in_features]` layout; and `gguf_model_type`, which reads only
the header's architecture, without the `gguf` package, for a loader choosing a precision before it converts.

It owns no model knowledge beyond GGUF's key names and never imports torch or llama.cpp.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Final

import numpy as np

from sie.worker.convert.errors import ConversionError

_MISSING = object()
# llama.cpp's token types (gguf.TokenType, `tokenizer.ggml.token_type`): control tokens are the special ones,
# user-defined ones are added tokens matched whole but decoded like text.
TOKEN_TYPE_NORMAL: Final = 1
TOKEN_TYPE_CONTROL: Final = 3
TOKEN_TYPE_USER_DEFINED: Final = 4
# transformers' model_type for a llama.cpp architecture, where the two names differ (Gemma 3's text decoder).
MODEL_TYPES: Final = {"gemma3": "gemma3_text"}
_ARCHITECTURE_KEY: Final = "general.architecture"
# The bytes of one value of each of GGUF's scalar metadata types (gguf.GGUFValueType); 8 is a string, 9 an array.
_SCALAR_SIZES: Final = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def _import_gguf():  # noqa: ANN202 - returns the module
    try:
        import gguf
    except ImportError as exc:
        raise ConversionError("the `gguf` package is not installed: pip install 'gguf==0.19.0'") from exc
    return gguf


class GgufFile:
    """One GGUF file, memory-mapped: metadata is parsed on open, tensor data is read when `load` asks for it."""

    def __init__(self, path: Path, on_read: Callable[[int, int], None] | None = None) -> None:
        """`on_read(done_bytes, total_bytes)` is called after each `load` with the tensor bytes read so far."""
        gguf = _import_gguf()
        self.path = Path(path)
        self._on_read = on_read
        self._read_bytes = 0
        try:
            self._reader = gguf.GGUFReader(self.path, "r")
        except (OSError, ValueError) as exc:
            raise ConversionError(f"not a readable GGUF file: {exc}", source=str(self.path)) from exc
        self._tensors = {tensor.name: tensor for tensor in self._reader.tensors}
        self._total_bytes = sum(int(tensor.n_bytes) for tensor in self._tensors.values())
        self._dequantize = gguf.quants.dequantize

    @property
    def architecture(self) -> str:
        return str(self.value("general.architecture"))

    def value(self, key: str, default: Any = _MISSING) -> Any:
        """A metadata value (int, float, bool, str or a list of them); `default` when absent, else an error."""
        field = self._reader.fields.get(key)
        if field is None:
            if default is _MISSING:
                raise ConversionError(f"metadata key {key!r} is missing", source=str(self.path))
            return default
        return field.contents()

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    @property
    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        """The numpy shape `load(name)` returns, without reading the data."""
        return tuple(int(dim) for dim in reversed(self._tensor(name).shape))

    def load(self, name: str) -> np.ndarray:
        """The tensor `name` as float32, dequantized, rows first: `[out, in]` for a matrix (GGUF lists dims
        innermost first, so its `[in, out]` is numpy's `[out, in]`)."""
        tensor = self._tensor(name)
        try:
            array = self._dequantize(tensor.data, tensor.tensor_type)
        except (NotImplementedError, ValueError) as exc:
            raise ConversionError(
                f"cannot dequantize {tensor.tensor_type.name}: {exc}", source=str(self.path), tensor=name
            ) from exc
        expected = self.shape(name)
        self._read_bytes += int(tensor.n_bytes)
        if self._on_read is not None:
            self._on_read(self._read_bytes, self._total_bytes)
        return np.asarray(array, dtype=np.float32).reshape(expected)

    def _tensor(self, name: str) -> Any:
        tensor = self._tensors.get(name)
        if tensor is None:
            raise ConversionError("tensor not found", source=str(self.path), tensor=name)
        return tensor


def gguf_model_type(path: Path) -> str:
    """The transformers model_type of the GGUF file at `path`, from its header's `general.architecture` alone (the
    `gguf` package parses every array of the metadata on open: seconds for a 262k-token vocabulary)."""
    try:
        with Path(path).open("rb") as handle:
            architecture = _read_architecture(handle)
    except (OSError, struct.error, UnicodeDecodeError) as exc:
        raise ConversionError(f"not a readable GGUF file: {exc}", source=str(path)) from exc
    if architecture is None:
        raise ConversionError(f"metadata key {_ARCHITECTURE_KEY!r} is missing", source=str(path))
    return MODEL_TYPES.get(architecture, architecture)


def _read_architecture(handle: BinaryIO) -> str | None:
    magic, version = struct.unpack("<4sI", handle.read(8))
    if magic != b"GGUF" or version < 2:  # noqa: PLR2004 - version 1 counted in 32 bits
        raise ValueError(f"magic {magic!r}, version {version}")
    _tensors, keys = struct.unpack("<QQ", handle.read(16))
    for _ in range(keys):
        key = _read_string(handle)
        (value_type,) = struct.unpack("<I", handle.read(4))
        if key == _ARCHITECTURE_KEY and value_type == _STRING:
            return _read_string(handle)
        _skip_value(handle, value_type)
    return None


def _read_string(handle: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", handle.read(8))
    return handle.read(length).decode("utf-8")


def _skip_value(handle: BinaryIO, value_type: int) -> None:
    if value_type == _STRING:
        (length,) = struct.unpack("<Q", handle.read(8))
        handle.seek(length, 1)
    elif value_type == _ARRAY:
        item_type, count = struct.unpack("<IQ", handle.read(12))
        if item_type in _SCALAR_SIZES:
            handle.seek(count * _SCALAR_SIZES[item_type], 1)
        else:
            for _ in range(count):
                _skip_value(handle, item_type)
    elif value_type in _SCALAR_SIZES:
        handle.seek(_SCALAR_SIZES[value_type], 1)
    else:
        raise ValueError(f"unknown metadata value type {value_type}")
