"""Start-up of the config service: restore from the store (on by default; off only over a store without models),
the stored epoch, the role's router id, and a write whose caller is cancelled mid-commit still completing."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from sie.control.errors import UnrestoredStoreError
from sie.control.loading import load_registry, restore_models
from sie.control.registry import SOURCE_API
from sie.control.writes import ConfigWriter
from sie.roles import ROLE_MODULES
from sie.roles.config import config_router_id, open_state
from sie.settings import load_settings
from sie.stores.config_store import CorruptEpochError, MemoryConfigStore

REPO = Path(__file__).resolve().parents[2]
BODY = {
    "sie_id": "acme/m",
    "hf_id": "acme/m",
    "profiles": {"default": {"adapter_path": "sie.adapters.dense:D", "max_batch_tokens": 8}},
}


def registry():  # noqa: ANN201
    return load_registry(REPO / "config/bundles", REPO / "config/models")


STORED_MODEL = (
    "sie_id: acme/m\nhf_id: acme/m\nprofiles:\n  default:\n    adapter_path: sie.adapters.dense:D\n"
    "    max_batch_tokens: 8\n"
)


def test_restore_replays_stored_models_and_skips_bad_ones() -> None:
    store = MemoryConfigStore()
    store.write_model("acme/m", STORED_MODEL)
    store.write_model("acme/bad", "sie_id: acme/bad\n")
    loaded = registry()
    assert restore_models(loaded, store) == 1
    assert loaded.state.source("acme/m") == SOURCE_API
    assert loaded.state.find_model("acme/bad") is None


def test_role_is_registered_and_router_id_is_trusted() -> None:
    assert ROLE_MODULES["config"] == "sie.roles.config"
    assert config_router_id(load_settings(environ={"SIE_ROUTER_ID": "gw-1"})) == "sie-config"
    assert config_router_id(load_settings(environ={"SIE_ROUTER_ID": "sie-config-7f9c"})) == "sie-config-7f9c"


async def test_corrupt_epoch_refuses_to_start(tmp_path: Path) -> None:
    (tmp_path / "epoch").write_text("")
    settings = load_settings(environ={"SIE_CONFIG_STORE_DIR": str(tmp_path)})
    with pytest.raises(CorruptEpochError):
        await open_state(settings)


async def test_open_state_reads_epoch_and_restores(tmp_path: Path) -> None:
    (tmp_path / "epoch").write_text("7")
    settings = load_settings(environ={"SIE_CONFIG_STORE_DIR": str(tmp_path), "SIE_CONFIG_RESTORE": "true"})
    store, loaded, epoch = await open_state(settings)
    assert epoch == 7 and loaded.available


def stored_model_dir(tmp_path: Path) -> Path:
    """A store at epoch 3 holding one API-written model."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "acme__m.yaml").write_text(STORED_MODEL)
    (tmp_path / "epoch").write_text("3")
    return tmp_path


async def test_stored_models_are_restored_by_default(tmp_path: Path) -> None:
    settings = load_settings(environ={"SIE_CONFIG_STORE_DIR": str(stored_model_dir(tmp_path))})
    assert settings.config_service.restore is True
    _store, loaded, epoch = await open_state(settings)
    assert epoch == 3 and loaded.state.source("acme/m") == SOURCE_API


async def test_restore_off_over_stored_models_refuses_to_start(tmp_path: Path) -> None:
    environ = {"SIE_CONFIG_STORE_DIR": str(stored_model_dir(tmp_path)), "SIE_CONFIG_RESTORE": "false"}
    with pytest.raises(UnrestoredStoreError, match="SIE_CONFIG_RESTORE=true") as refused:
        await open_state(load_settings(environ=environ))
    assert "holds 1 models" in refused.value.message


async def test_restore_off_over_a_store_without_models_starts(tmp_path: Path) -> None:
    (tmp_path / "epoch").write_text("2")
    environ = {"SIE_CONFIG_STORE_DIR": str(tmp_path), "SIE_CONFIG_RESTORE": "false"}
    _store, loaded, epoch = await open_state(load_settings(environ=environ))
    assert epoch == 2 and loaded.available


class SlowStore(MemoryConfigStore):
    """A store whose model write blocks until released (a slow object store)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def write_model(self, model_id: str, yaml_text: str) -> None:
        self.entered.set()
        self.release.wait(5)
        super().write_model(model_id, yaml_text)


async def test_cancelled_caller_mid_commit_still_commits() -> None:
    store = SlowStore()
    loaded = registry()
    writer = ConfigWriter(loaded, store)
    task = asyncio.create_task(writer.add_model(dict(BODY)))
    await asyncio.to_thread(store.entered.wait, 5)
    task.cancel()
    await asyncio.sleep(0)
    store.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert writer.epoch == 1 and store.read_epoch() == 1
    assert loaded.state.find_model("acme/m") is not None


async def test_cancelled_caller_before_commit_changes_nothing() -> None:
    store = MemoryConfigStore()
    loaded = registry()
    writer = ConfigWriter(loaded, store)
    async with writer._lock:  # noqa: SLF001 - hold the write lock so the write waits before committing
        task = asyncio.create_task(writer.add_model(dict(BODY)))
        await asyncio.sleep(0)
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert writer.epoch == 0 and store.list_models() == {}
