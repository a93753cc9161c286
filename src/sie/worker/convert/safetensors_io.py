"""A minimal safetensors reader: the JSON header plus raw little-endian buffers, read per tensor, and a checkpoint's
tensors across its files (`model.safetensors`, the shards a `model.safetensors.index.json` lists, or a
`pytorch_model.bin` zip through `torch_zip`).

Floating tensors (F32, F16, BF16) come back as float32 numpy arrays. It owns no model knowledge and
must not import torch or the `safetensors` package.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.names import (
    OPEN_CLIP_CONFIG_FILE,
    OPEN_CLIP_WEIGHTS_FILES,
    TORCH_WEIGHTS_FILE,
    WEIGHTS_FILE,
    WEIGHTS_INDEX_FILE,
)
from sie.worker.convert.torch_zip import FLOAT_STORAGES, TorchTensorEntry, TorchZipFile

# The format caps the header at 100 MB; anything larger is a corrupt length prefix.
MAX_HEADER_BYTES = 100 * 1024 * 1024
FLOAT_DTYPES = {"F32": 4, "F16": 2, "BF16": 2}
_OTHER_DTYPES = {"F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
_ITEM_SIZES = FLOAT_DTYPES | _OTHER_DTYPES


@attrs.frozen
class TensorEntry:
    """Where one tensor's bytes sit in the file (absolute offsets) and how to read them."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


class SafetensorsFile:
    """A parsed header; tensor data is read from disk only when `load` asks for it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.entries = _read_header(self.path)

    def names(self) -> list[str]:
        return sorted(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def load(self, name: str) -> np.ndarray:
        """The tensor `name` as a C-contiguous float32 array of its stored shape."""
        entry = self.entries.get(name)
        if entry is None:
            raise ConversionError("tensor not found", source=str(self.path), tensor=name)
        if entry.dtype not in FLOAT_DTYPES:
            raise ConversionError(
                f"dtype {entry.dtype} is not a float type (F32, F16, BF16)", source=str(self.path), tensor=name
            )
        with self.path.open("rb") as handle:
            handle.seek(entry.start)
            raw = handle.read(entry.end - entry.start)
        if len(raw) != entry.end - entry.start:
            raise ConversionError("file is truncated inside the tensor data", source=str(self.path), tensor=name)
        return decode_float(raw, entry.dtype).reshape(entry.shape)

    def load_rows(self, name: str, rows: list[int]) -> np.ndarray:
        """Rows of the matrix `name` (float32 `[len(rows), columns]`), reading only those rows' bytes: two rows of
        a 150,000-token output head without the other 149,998."""
        entry = self.entries.get(name)
        if entry is None or entry.dtype not in FLOAT_DTYPES or len(entry.shape) != 2:
            return self.load(name)[rows]  # the whole tensor's checks and errors
        row_bytes = entry.shape[1] * FLOAT_DTYPES[entry.dtype]
        chunks = []
        with self.path.open("rb") as handle:
            for row in rows:
                if not 0 <= row < entry.shape[0]:
                    raise ConversionError(f"row {row} is outside the tensor's {entry.shape[0]}", source=str(self.path),
                                          tensor=name)  # fmt: skip
                handle.seek(entry.start + row * row_bytes)
                raw = handle.read(row_bytes)
                if len(raw) != row_bytes:
                    raise ConversionError(
                        "file is truncated inside the tensor data", source=str(self.path), tensor=name
                    )
                chunks.append(decode_float(raw, entry.dtype))
        return np.stack(chunks) if chunks else np.empty((0, entry.shape[1]), dtype=np.float32)


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The files holding a checkpoint's tensors, in a stable order: `model.safetensors`, else the index followed by
    the shards it names, else `pytorch_model.bin` (read by `torch_zip`). ConversionError when there is none of them,
    or the index is unreadable or names a missing shard."""
    model_dir = Path(model_dir)
    single = model_dir / WEIGHTS_FILE
    if single.is_file():
        return [single]
    index = model_dir / WEIGHTS_INDEX_FILE
    if not index.is_file():
        if (model_dir / TORCH_WEIGHTS_FILE).is_file():
            return [model_dir / TORCH_WEIGHTS_FILE]
        raise ConversionError(
            f"no {WEIGHTS_FILE}, no {WEIGHTS_INDEX_FILE} and no {TORCH_WEIGHTS_FILE}", source=str(model_dir)
        )
    shards = sorted(set(_weight_map(index).values()))
    for shard in shards:
        if not (model_dir / shard).is_file():
            raise ConversionError(f"names shard {shard!r}, which is not in {model_dir}", source=str(index))
    return [index, *(model_dir / shard for shard in shards)]


def open_clip_weights_file(model_dir: Path) -> Path | None:
    """The weights of an open_clip checkpoint in `model_dir` (its `open_clip_config.json` and
    `open_clip_model.safetensors`, else `open_clip_pytorch_model.bin`); None when the directory holds no such pair
    (a repository may hold a transformers checkpoint beside an open_clip config: that one is the checkpoint then)."""
    model_dir = Path(model_dir)
    if not (model_dir / OPEN_CLIP_CONFIG_FILE).is_file():
        return None
    return next((model_dir / name for name in OPEN_CLIP_WEIGHTS_FILES if (model_dir / name).is_file()), None)


def read_json(path: Path) -> Any:
    """A checkpoint's JSON file (`config.json`, the shard index), decoded; errors name the file."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConversionError(f"cannot read file: {exc}", source=str(path)) from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConversionError(f"not valid JSON: {exc}", source=str(path)) from exc


def _weight_map(index: Path) -> dict[str, str]:
    raw = read_json(index)
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(shard, str) and shard and "/" not in shard and shard not in (".", "..")
        for shard in weight_map.values()
    ):
        raise ConversionError("weight_map is not an object of tensor name -> shard file name", source=str(index))
    return weight_map


class Checkpoint:
    """Every tensor of a checkpoint directory, whichever of its files holds it; read only when `load` asks."""

    def __init__(self, model_dir: Path, files: list[Path] | None = None) -> None:
        """The checkpoint in `model_dir` (`checkpoint_files`), or in `files` where a layout names its own (open_clip's
        `open_clip_model.safetensors`): a `.bin` is read as a torch zip, anything else as safetensors."""
        files = files if files is not None else checkpoint_files(model_dir)
        self.path = files[0]  # what errors name: model.safetensors, the shard index or pytorch_model.bin
        self._file_of: dict[str, SafetensorsFile | TorchZipFile] = {}
        self.entries: dict[str, TensorEntry | TorchTensorEntry] = {}
        for path in files:
            if path.name == WEIGHTS_INDEX_FILE:
                continue
            shard = TorchZipFile(path) if path.suffix == ".bin" else SafetensorsFile(path)
            for name, entry in shard.entries.items():
                self._file_of[name] = shard
                self.entries[name] = entry

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def load(self, name: str) -> np.ndarray:
        """The tensor `name` as a C-contiguous float32 array of its stored shape."""
        shard = self._file_of.get(name)
        if shard is None:
            raise ConversionError("tensor not found", source=str(self.path), tensor=name)
        return shard.load(name)

    def load_rows(self, name: str, rows: list[int]) -> np.ndarray:
        """Rows of the matrix `name`, float32; from a safetensors file without reading the rest of it."""
        shard = self._file_of.get(name)
        if shard is None:
            raise ConversionError("tensor not found", source=str(self.path), tensor=name)
        if isinstance(shard, SafetensorsFile):
            return shard.load_rows(name, rows)
        return shard.load(name)[rows]


class CheckpointPart:
    """The tensors of a checkpoint under one name prefix, by their names without it: a model nested in another
    (GLiNER's backbone under `token_rep_layer.bert_layer.model.`) read as if saved on its own."""

    def __init__(self, checkpoint: Checkpoint, prefix: str) -> None:
        self.path = checkpoint.path
        self._checkpoint = checkpoint
        self._prefix = prefix
        self.entries = {
            name[len(prefix) :]: entry for name, entry in checkpoint.entries.items() if name.startswith(prefix)
        }

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def load(self, name: str) -> np.ndarray:
        return self._checkpoint.load(self._prefix + name)

    def load_rows(self, name: str, rows: list[int]) -> np.ndarray:
        return self._checkpoint.load_rows(self._prefix + name, rows)


def checkpoint_parameters(model_dir: Path, files: list[Path] | None = None) -> int:
    """How many floating-point values a checkpoint holds (`Checkpoint`'s files), from their headers (no tensor is
    read)."""
    checkpoint = Checkpoint(model_dir, files)
    return sum(math.prod(entry.shape) for entry in checkpoint.entries.values() if _is_float(entry))


def _is_float(entry: TensorEntry | TorchTensorEntry) -> bool:
    return entry.dtype in (FLOAT_DTYPES if isinstance(entry, TensorEntry) else FLOAT_STORAGES)


def decode_float(raw: bytes, dtype: str) -> np.ndarray:
    """Little-endian F32/F16/BF16 bytes to a flat float32 array (BF16 is the top half of an F32)."""
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    if dtype == "BF16":
        widened = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return widened.view(np.float32)
    raise ValueError(f"not a float dtype: {dtype}")


def _read_header(path: Path) -> dict[str, TensorEntry]:
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise ConversionError("file is shorter than the 8-byte header length", source=str(path))
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > MAX_HEADER_BYTES:
                raise ConversionError(f"header length {header_len} is not plausible", source=str(path))
            header_bytes = handle.read(header_len)
    except OSError as exc:
        raise ConversionError(f"cannot read file: {exc}", source=str(path)) from exc
    try:
        header = json.loads(header_bytes)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConversionError(f"header is not valid JSON: {exc}", source=str(path)) from exc
    if not isinstance(header, dict):
        raise ConversionError("header is not a JSON object", source=str(path))
    data_start = 8 + header_len
    data_size = path.stat().st_size - data_start
    return {
        name: _parse_entry(path, name, spec, data_start, data_size)
        for name, spec in header.items()
        if name != "__metadata__"
    }


def _parse_entry(path: Path, name: str, spec: Any, data_start: int, data_size: int) -> TensorEntry:
    def fail(message: str) -> ConversionError:
        return ConversionError(message, source=str(path), tensor=name)

    if not isinstance(spec, dict):
        raise fail("header entry is not an object")
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if dtype not in _ITEM_SIZES:
        raise fail(f"unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(dim, int) and dim >= 0 for dim in shape):
        raise fail(f"shape {shape!r} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise fail(f"data_offsets {offsets!r} is not a [begin, end] pair")
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        raise fail(f"data_offsets {offsets} fall outside the {data_size}-byte data section")
    expected = math.prod(shape) * _ITEM_SIZES[dtype]
    if end - begin != expected:
        raise fail(f"holds {end - begin} bytes but {dtype} {shape} needs {expected}")
    return TensorEntry(dtype=dtype, shape=tuple(shape), start=data_start + begin, end=data_start + end)
