"""A GGUF file (llama.cpp's format): metadata values and tensor infos parsed here, tensors dequantized to float32 by
the pure-Python `gguf` package in Hugging Face `[out_features, in_features]` layout; and `gguf_model_type`, which
reads only the header's architecture, for a loader choosing a precision before it converts.

It owns no model knowledge beyond GGUF's key names and never imports torch or llama.cpp.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import attrs
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
# GGUF's metadata value types (gguf.GGUFValueType) that are no scalar.
_STRING, _ARRAY = 8, 9


def _import_gguf():  # noqa: ANN202 - returns the module
    try:
        import gguf
    except ImportError as exc:
        raise ConversionError("the `gguf` package is not installed: pip install 'gguf==0.19.0'") from exc
    return gguf


# The `gguf` package dequantizes 16 rows of blocks per numpy call, in a Python loop: rows are joined up to this many
# bytes first (each block carries its own scales, so a longer row of the same blocks dequantizes to the same values).
# Reading every tensor of Gemma 3 270M Q4_K_M (a 262k-row embedding table): 3.6 -> 2.1 s of CPU.
JOINED_ROW_BYTES: Final = 64 * 1024


def _joined_rows(blocks: np.ndarray) -> np.ndarray:
    """Quantized `blocks` [..., row bytes] as [rows / k, k * row bytes], k the most whole rows within JOINED_ROW_BYTES
    that divides the row count."""
    rows = blocks.reshape(-1, blocks.shape[-1])
    count, width = rows.shape
    joined = max(1, min(count, JOINED_ROW_BYTES // max(1, width)))
    while count % joined:
        joined -= 1
    return rows.reshape(count // joined, joined * width)


class GgufFile:
    """One GGUF file, memory-mapped: metadata and tensor infos are parsed on open (here, not by the `gguf` package,
    whose reader takes seconds over a 262k-token vocabulary), tensor data is read when `load` asks for it and
    dequantized by the `gguf` package."""

    def __init__(self, path: Path, on_read: Callable[[int, int], None] | None = None) -> None:
        """`on_read(done_bytes, total_bytes)` is called after each `load` with the tensor bytes read so far."""
        gguf = _import_gguf()
        self.path = Path(path)
        self._on_read = on_read
        self._read_bytes = 0
        self._gguf = gguf
        try:
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
            self._fields, self._tensors = _parse(self._data, gguf)
        except (OSError, ValueError, struct.error, UnicodeDecodeError, KeyError) as exc:
            raise ConversionError(f"not a readable GGUF file: {exc}", source=str(self.path)) from exc
        self._total_bytes = sum(tensor.n_bytes for tensor in self._tensors.values())

    @property
    def architecture(self) -> str:
        return str(self.value("general.architecture"))

    def value(self, key: str, default: Any = _MISSING) -> Any:
        """A metadata value (int, float, bool, str or a list of them); `default` when absent, else an error."""
        if key not in self._fields:
            if default is _MISSING:
                raise ConversionError(f"metadata key {key!r} is missing", source=str(self.path))
            return default
        return self._fields[key]

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    @property
    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        """The numpy shape `load(name)` returns, without reading the data."""
        return tuple(reversed(self._tensor(name).dims))

    def load(self, name: str) -> np.ndarray:
        """The tensor `name` as float32, dequantized, rows first: `[out, in]` for a matrix (GGUF lists dims
        innermost first, so its `[in, out]` is numpy's `[out, in]`)."""
        tensor = self._tensor(name)
        qtype = self._gguf.GGMLQuantizationType(tensor.ggml_type)
        expected = self.shape(name)
        raw = self._data[tensor.offset : tensor.offset + tensor.n_bytes]
        plain = _PLAIN_TYPES.get(qtype.name)
        if plain is not None:
            data = raw.view(plain)
        else:  # blocks of bytes, one row of blocks per output row
            data = _joined_rows(raw.reshape(self._gguf.quant_shape_to_byte_shape(expected, qtype)))
        try:
            array = self._gguf.quants.dequantize(data, qtype)
        except (NotImplementedError, ValueError) as exc:
            raise ConversionError(f"cannot dequantize {qtype.name}: {exc}", source=str(self.path), tensor=name) from exc
        self._read_bytes += tensor.n_bytes
        if self._on_read is not None:
            self._on_read(self._read_bytes, self._total_bytes)
        return np.asarray(array, dtype=np.float32).reshape(expected)

    def _tensor(self, name: str) -> _TensorInfo:
        tensor = self._tensors.get(name)
        if tensor is None:
            raise ConversionError("tensor not found", source=str(self.path), tensor=name)
        return tensor


@attrs.frozen
class _TensorInfo:
    """Where one tensor's data lies in the file: its GGUF dims (innermost first), ggml type, offset and size."""

    dims: tuple[int, ...]
    ggml_type: int
    offset: int
    n_bytes: int


# ggml types stored as plain numbers (read as such; every other type is blocks of bytes the `gguf` package decodes).
_PLAIN_TYPES: Final = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                       "I32": np.int32, "I64": np.int64}  # fmt: skip
# struct formats of GGUF's scalar metadata types (gguf.GGUFValueType); 8 is a string, 9 an array.
_SCALAR_FORMATS: Final = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
                          11: "<q", 12: "<d"}  # fmt: skip
_SCALAR_DTYPES: Final = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8",
                         11: "<i8", 12: "<f8"}  # fmt: skip
_DEFAULT_ALIGNMENT: Final = 32


def _parse(data: np.ndarray, gguf: Any) -> tuple[dict[str, Any], dict[str, _TensorInfo]]:
    """The metadata values and tensor infos of a whole GGUF file (versions 2 and 3, little-endian)."""
    reader, tensor_count, key_count = _header(data)
    fields: dict[str, Any] = {}
    for _ in range(key_count):
        key = reader.string()
        fields[key] = reader.value(reader.scalar(4))
    infos: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(tensor_count):
        name = reader.string()
        dims = tuple(int(reader.scalar(10)) for _ in range(reader.scalar(4)))
        infos.append((name, dims, reader.scalar(4), reader.scalar(10)))
    alignment = int(fields.get("general.alignment", _DEFAULT_ALIGNMENT))
    start = -(-reader.offset // alignment) * alignment
    tensors: dict[str, _TensorInfo] = {}
    for name, dims, ggml_type, offset in infos:
        if name in tensors:
            raise ValueError(f"tensor {name!r} is listed twice")
        block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
        n_bytes = math.prod(dims) * type_size // block_size
        if start + offset + n_bytes > len(data):
            raise ValueError(f"tensor {name!r} lies past the end of the file")
        tensors[name] = _TensorInfo(dims, ggml_type, start + offset, n_bytes)
    return fields, tensors


class _Reader:
    """Sequential reads of GGUF's metadata encoding from a buffer."""

    def __init__(self, buffer: memoryview, offset: int) -> None:
        self.buffer = buffer
        self.offset = offset

    def scalar(self, value_type: int) -> Any:
        (value,) = struct.unpack_from(_SCALAR_FORMATS[value_type], self.buffer, self.offset)
        self.offset += struct.calcsize(_SCALAR_FORMATS[value_type])
        return value

    def string(self) -> str:
        length = self.scalar(10)
        text = bytes(self.buffer[self.offset : self.offset + length]).decode("utf-8")
        self.offset += length
        return text

    def value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self.string()
        if value_type != _ARRAY:
            return self.scalar(value_type)
        item_type, count = self.scalar(4), self.scalar(10)
        if item_type in _SCALAR_DTYPES:  # a run of numbers: read at once
            items = np.frombuffer(self.buffer, dtype=_SCALAR_DTYPES[item_type], count=count, offset=self.offset)
            self.offset += items.nbytes
            return items.tolist()
        return [self.value(item_type) for _ in range(count)]


def gguf_model_type(path: Path) -> str:
    """The transformers model_type of the GGUF file at `path`, from its header's `general.architecture` alone (the
    metadata before it is read, llama.cpp writes it first; no tensor info, no `gguf` package)."""
    architecture = None
    try:
        reader, _, key_count = _header(np.memmap(path, dtype=np.uint8, mode="r"))
        for _ in range(key_count):
            key, value = reader.string(), reader.value(reader.scalar(4))
            if key == _ARCHITECTURE_KEY:
                architecture = value
                break
    except (OSError, ValueError, struct.error, UnicodeDecodeError, KeyError) as exc:
        raise ConversionError(f"not a readable GGUF file: {exc}", source=str(path)) from exc
    if not isinstance(architecture, str):
        raise ConversionError(f"metadata key {_ARCHITECTURE_KEY!r} is missing", source=str(path))
    return MODEL_TYPES.get(architecture, architecture)


def _header(data: np.ndarray) -> tuple[_Reader, int, int]:
    """A reader past the header of a GGUF file (versions 2 and 3, little-endian), its tensor and key counts."""
    buffer = memoryview(data)
    magic, version = struct.unpack_from("<4sI", buffer, 0)
    if magic != b"GGUF" or version < 2:  # noqa: PLR2004 - version 1 counted in 32 bits
        raise ValueError(f"magic {magic!r}, version {version}")
    tensor_count, key_count = struct.unpack_from("<QQ", buffer, 8)
    return _Reader(buffer, 24), tensor_count, key_count
