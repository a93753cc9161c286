"""A GGUF file (llama.cpp's format) read with the pure-Python `gguf` package: metadata values and tensors
dequantized to float32 in Hugging Face `[out_features, in_features]` layout.

It owns no model knowledge beyond GGUF's key names and never imports torch or llama.cpp.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sie.worker.convert.errors import ConversionError

_MISSING = object()


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
