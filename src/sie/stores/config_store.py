"""The ConfigStore protocol: where the config service persists model YAMLs and the epoch (seed 000 §9).

Layout under the base: `models/{model id with / → __}.yaml` and `epoch` (a plain integer). Ids holding
`__` are refused (they would not map back). Implementations: `MemoryConfigStore` (no persistence, for
a config service without SIE_CONFIG_STORE_DIR and for tests) and the fsspec store in `fsspec_store.py`.

    ConfigStoreError           the store cannot be read or written (I/O, permissions, object store)
    └── CorruptEpochError      the epoch file exists but is empty or not an integer (never read as 0)
"""

from __future__ import annotations

from typing import Protocol


class ConfigStoreError(Exception):
    """Reading or writing the config store failed; the message names the path."""


class CorruptEpochError(ConfigStoreError):
    """The epoch file is empty or malformed; silently treating it as 0 would hide drift (seed 000 §9)."""


def model_file_name(model_id: str) -> str:
    """`BAAI/bge-m3` → `BAAI__bge-m3.yaml`; an id containing `__` cannot be stored."""
    if "__" in model_id:
        raise ConfigStoreError(f"model id {model_id!r} contains '__', which the store uses for '/'")
    return model_id.replace("/", "__") + ".yaml"


def model_id_from_file(name: str) -> str:
    return name.removesuffix(".yaml").replace("__", "/")


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
