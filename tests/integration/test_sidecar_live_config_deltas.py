"""Live config on a worker, the delta path: trusted bundle deltas reach the worker's catalogue through
ApplyModelConfig, and the applied epoch/hash advance only when the worker's hash matches the control plane's."""

from __future__ import annotations

from pathlib import Path

import pytest

from sie.catalog import dump_yaml, load_catalog, load_yaml, parse_model_config
from sie.catalog.names import config_subject
from sie.settings import BatchingSettings, LaneSettings, load_settings
from sie.sidecar.live_config import LiveConfig
from sie.transport.loopback import LoopbackTransport
from sie.wire.config import ConfigNotification
from sie.worker.manager import ModelManager
from sie.worker.runner import BatchRunner
from sie.worker.service import WorkerService

REPO = Path(__file__).resolve().parents[2]
NEW_MODEL = "acme/minilm-copy"


@pytest.fixture()
def new_model_yaml() -> str:
    text = (REPO / "config" / "models" / "sentence-transformers__all-MiniLM-L6-v2.yaml").read_text()
    data = load_yaml(text)
    data["sie_id"] = NEW_MODEL
    return dump_yaml(data)


def note(model_yaml: str, epoch: int, expected_hash: str, producer: str = "sie-config") -> ConfigNotification:
    return ConfigNotification(
        router_id=producer, bundle_id="default", epoch=epoch, bundle_config_hash=expected_hash,
        model_id=NEW_MODEL, model_config=model_yaml, profiles_added=["default"], affected_bundles=["default"],
    )  # fmt: skip


async def test_trusted_delta_is_applied_and_acknowledged(new_model_yaml: str) -> None:
    catalog = load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")
    expected = catalog.with_models([parse_model_config(load_yaml(new_model_yaml))]).bundle_config_hash("default")
    settings = load_settings(environ={})
    async with ModelManager(catalog, lambda *args: None) as manager, LoopbackTransport() as bus:
        worker = WorkerService(manager, BatchRunner(manager), "w-1", LaneSettings(), BatchingSettings())
        async with LiveConfig(bus, worker, settings) as live:
            await bus.publish(config_subject("default"), note(new_model_yaml, 3, expected, producer="mallory"))
            assert live.rejected == 1 and manager.catalog.find(NEW_MODEL) is None
            await bus.publish(config_subject("default"), note(new_model_yaml, 3, "0" * 64))
            assert live.epoch == 0  # the worker's hash did not match: not acknowledged
            await bus.publish(config_subject("default"), note(new_model_yaml, 4, expected))
            assert manager.catalog.find(NEW_MODEL) is not None
            assert (live.epoch, live.bundle_config_hash) == (4, expected)
            assert worker.bundle_config_hash() == expected
            await bus.publish(config_subject("default"), note(new_model_yaml, 2, expected))
            assert live.epoch == 4  # an older epoch never moves it back
