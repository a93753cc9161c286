"""A reader of PyTorch's zip checkpoints (`torch.save` since 1.6: `pytorch_model.bin`, BGE-M3's `sparse_linear.pt`)
without torch and without running the pickle's code.

Such a file is a zip of `<archive>/data.pkl` (the state dict's structure) and `<archive>/data/<key>` (each storage's
raw little-endian bytes). The pickle is read by an unpickler that knows exactly the few callables a state dict of
tensors uses (`OrderedDict`, `torch._utils._rebuild_tensor_v2` / `_rebuild_parameter`, the storage types) and
refuses any other, so a checkpoint that asks to run something else fails to load instead of running it. A training
checkpoint's nested state dicts name their tensors by dotted path (`pruning_head.classifier.0.weight`). A tensor is
read from its storage when `load` asks, as a float32 array (float16 and bfloat16 widened).
"""

from __future__ import annotations

import collections
import pickle
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from sie.worker.convert.errors import ConversionError

# torch's storage classes by name -> (numpy dtype, item size); bfloat16 is read as uint16 and widened.
STORAGE_TYPES: dict[str, tuple[str, int]] = {
    "FloatStorage": ("<f4", 4),
    "HalfStorage": ("<f2", 2),
    "BFloat16Storage": ("<u2", 2),
    "DoubleStorage": ("<f8", 8),
    "LongStorage": ("<i8", 8),
    "IntStorage": ("<i4", 4),
    "ShortStorage": ("<i2", 2),
    "CharStorage": ("i1", 1),
    "ByteStorage": ("u1", 1),
    "BoolStorage": ("?", 1),
}
FLOAT_STORAGES = frozenset({"FloatStorage", "HalfStorage", "BFloat16Storage"})


@attrs.frozen
class _StorageType:
    name: str


@attrs.frozen
class _Storage:
    kind: str  # a STORAGE_TYPES name
    key: str  # the file `<archive>/data/<key>`


@attrs.frozen
class TorchTensorEntry:
    """Where one tensor lives: a view (offset and strides, in elements) of one storage."""

    storage: _Storage
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def dtype(self) -> str:
        return self.storage.kind


def _rebuild_tensor(storage: _Storage, offset: int, size: tuple, stride: tuple, *_: Any) -> TorchTensorEntry:
    return TorchTensorEntry(storage, int(offset), tuple(int(n) for n in size), tuple(int(n) for n in stride))


def _rebuild_parameter(data: TorchTensorEntry, *_: Any) -> TorchTensorEntry:
    return data


_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", name): _StorageType(name) for name in STORAGE_TYPES},
}


class _StateDictUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a state dict of tensors")
        return allowed

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        kind = pid[1]
        if not isinstance(kind, _StorageType):
            raise pickle.UnpicklingError(f"unexpected storage type {kind!r}")
        return _Storage(kind.name, str(pid[2]))


def _tensors(state: dict, prefix: str = "") -> Iterator[tuple[str, TorchTensorEntry]]:
    """The tensors of a state dict, nested ones (a training checkpoint's `{"pruning_head": {...}, "epoch": 3}`) under
    their dotted path; numbers, strings and the like beside them are not tensors and are passed over."""
    for name, value in state.items():
        if isinstance(value, TorchTensorEntry):
            yield f"{prefix}{name}", value
        elif isinstance(value, dict):
            yield from _tensors(value, f"{prefix}{name}.")


class TorchZipFile:
    """The tensors of one `torch.save` zip; the same interface as `SafetensorsFile` (`entries`, `load`)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            with zipfile.ZipFile(self.path) as archive:
                pickles = [name for name in archive.namelist() if name.endswith("/data.pkl")]
                if len(pickles) != 1:
                    raise ConversionError(f"holds {len(pickles)} data.pkl files, not one", source=str(self.path))
                self._prefix = pickles[0][: -len("data.pkl")]
                state = _StateDictUnpickler(archive.open(pickles[0])).load()
        except zipfile.BadZipFile as exc:
            raise ConversionError(
                f"not a zip checkpoint (a legacy torch.save pickle is not read): {exc}", source=str(self.path)
            ) from exc
        except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as exc:
            raise ConversionError(f"not a state dict of tensors: {exc}", source=str(self.path)) from exc
        if not isinstance(state, dict):
            raise ConversionError("does not hold a state dict of tensors", source=str(self.path))
        self.entries: dict[str, TorchTensorEntry] = dict(_tensors(state))
        if not self.entries:
            raise ConversionError("holds no tensors", source=str(self.path))

    def names(self) -> list[str]:
        return sorted(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def load(self, name: str) -> np.ndarray:
        """The tensor `name` as a C-contiguous float32 array of its shape."""
        entry = self.entries.get(name)
        if entry is None:
            raise ConversionError("tensor not found", source=str(self.path), tensor=name)
        if entry.dtype not in FLOAT_STORAGES:
            raise ConversionError(f"dtype {entry.dtype} is not a float storage", source=str(self.path), tensor=name)
        numpy_dtype, item_size = STORAGE_TYPES[entry.dtype]
        with zipfile.ZipFile(self.path) as archive:
            raw = archive.read(f"{self._prefix}data/{entry.storage.key}")
        flat = np.frombuffer(raw, dtype=numpy_dtype)
        last = entry.offset + sum((size - 1) * step for size, step in zip(entry.shape, entry.stride, strict=True))
        if entry.shape and min(entry.shape) > 0 and last >= len(flat):
            raise ConversionError("the tensor's view runs past its storage", source=str(self.path), tensor=name)
        view = np.lib.stride_tricks.as_strided(
            flat[entry.offset :], shape=entry.shape, strides=[step * item_size for step in entry.stride]
        )
        if entry.dtype == "BFloat16Storage":
            return (view.astype(np.uint32) << 16).view(np.float32)
        return np.array(view, dtype=np.float32, order="C")
