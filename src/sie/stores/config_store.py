"""The ConfigStore protocol: where the config service persists model YAMLs and the epoch (seed 000 §9).

Layout under the base: `models/{file name}.yaml` and `epoch` (a plain integer). File names are injective, so
two ids never share a file:

- a plain id (letters, digits, `.-:@`, and `_` or `/` never next to each other or to themselves) keeps the
  seed's naming, `/` → `__`: `BAAI/bge-m3` → `BAAI__bge-m3.yaml`. Read back, `__` → `/` is exact, because a
  plain id has no `_` beside a `/` and no `__` of its own.
- any other id is escaped: every character outside letters, digits and `.-:@` becomes `~` and the two hex
  digits of each of its UTF-8 bytes: `coll-org_/model` → `coll-org~5F~2Fmodel.yaml`, `coll-org/_model` →
  `coll-org~2F~5Fmodel.yaml`. A plain name never holds `~`, so the two forms never meet.

Stores written before escaping named every id the plain way (and refused ids with `__`); such a file still
reads back as `__` → `/` (`legacy_file_name` finds it for deletes, and an escaped file of the same id wins).
A file name is at most 255 bytes (NAME_MAX of common filesystems); a longer one is ModelIdNotStorableError.
Implementations: `MemoryConfigStore` (no persistence, for a config service without SIE_CONFIG_STORE_DIR and
for tests) and the fsspec store in `fsspec_store.py`.

    ConfigStoreError                the store cannot be read or written (I/O, permissions, object store)
    ├── CorruptEpochError           the epoch file exists but is empty or not an integer (never read as 0)
    └── ModelIdNotStorableError     the id's file name would be longer than a file name may be
"""

from __future__ import annotations

import string
import urllib.parse
from typing import Final, Protocol

MODEL_SUFFIX: Final = ".yaml"
MAX_FILE_NAME_BYTES: Final = 255
_PLAIN_CHARACTERS: Final = frozenset(string.ascii_letters + string.digits + ".-:@")
_ESCAPE: Final = "~"


class ConfigStoreError(Exception):
    """Reading or writing the config store failed; the message names the path."""


class CorruptEpochError(ConfigStoreError):
    """The epoch file is empty or malformed; silently treating it as 0 would hide drift (seed 000 §9)."""


class ModelIdNotStorableError(ConfigStoreError):
    """The model id cannot name a store file (empty, or too long once escaped)."""


def _is_plain(model_id: str) -> bool:
    if any(char not in _PLAIN_CHARACTERS and char not in "_/" for char in model_id):
        return False
    return not any(pair in model_id for pair in ("__", "_/", "/_"))


def _escaped(model_id: str) -> str:
    return "".join(
        char if char in _PLAIN_CHARACTERS else "".join(f"{_ESCAPE}{byte:02X}" for byte in char.encode("utf-8"))
        for char in model_id
    )


def model_file_name(model_id: str) -> str:
    """`BAAI/bge-m3` → `BAAI__bge-m3.yaml`, `coll-org_/model` → `coll-org~5F~2Fmodel.yaml` (see the module)."""
    stem = model_id.replace("/", "__") if _is_plain(model_id) else _escaped(model_id)
    name = stem + MODEL_SUFFIX
    if not model_id:
        raise ModelIdNotStorableError("an empty model id cannot be stored")
    if len(name.encode("utf-8")) > MAX_FILE_NAME_BYTES:
        size = len(name.encode("utf-8"))
        raise ModelIdNotStorableError(
            f"a model id of {len(model_id)} characters names a {size}-byte file, over the "
            f"{MAX_FILE_NAME_BYTES} bytes a file name may have"
        )
    return name


def model_id_from_file(name: str) -> str:
    """The id a model file name stands for: `~XX` escapes decoded, else `__` → `/`."""
    stem = name.removesuffix(MODEL_SUFFIX)
    if _ESCAPE in stem:
        return urllib.parse.unquote(stem.replace(_ESCAPE, "%"))
    return stem.replace("__", "/")


def legacy_file_name(model_id: str) -> str | None:
    """The name a store written before escaping gave this id, when the id is escaped now and that old name
    still reads back as it (`coll-org/_model` was `coll-org___model.yaml`); else None."""
    if _is_plain(model_id) or "__" in model_id:
        return None
    name = model_id.replace("/", "__") + MODEL_SUFFIX
    return name if model_id_from_file(name) == model_id else None


class ConfigStore(Protocol):
    """Blocking calls (file or object store I/O): the config service runs them in a thread."""

    def read_epoch(self) -> int:
        """The stored epoch; 0 when no epoch was ever written; CorruptEpochError when unreadable."""

    def write_epoch(self, epoch: int) -> None:
        """Replace the epoch (atomically on a local disk)."""

    def list_models(self) -> dict[str, str]:
        """Every stored model: `{model_id: yaml_text}`."""

    def write_model(self, model_id: str, yaml_text: str) -> None:
        """Create or replace one model's YAML (atomically on a local disk)."""

    def delete_model(self, model_id: str) -> bool:
        """Remove one model's YAML; False when it was not stored."""


class MemoryConfigStore:
    """A ConfigStore held in memory: nothing survives the process (the seed's ephemeral default)."""

    def __init__(self) -> None:
        self._epoch = 0
        self._models: dict[str, str] = {}

    def read_epoch(self) -> int:
        return self._epoch

    def write_epoch(self, epoch: int) -> None:
        self._epoch = epoch

    def list_models(self) -> dict[str, str]:
        return dict(self._models)

    def write_model(self, model_id: str, yaml_text: str) -> None:
        model_file_name(model_id)
        self._models[model_id] = yaml_text

    def delete_model(self, model_id: str) -> bool:
        return self._models.pop(model_id, None) is not None
