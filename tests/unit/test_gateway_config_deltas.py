"""The gateway's config registry and live deltas (seed 000 §4.3): the producer allowlist, epoch `set_max`,
append-only merges, and the atomic snapshot swap.
"""

from __future__ import annotations

from typing import Any

import pytest

from sie.catalog import Catalog, dump_yaml, parse_bundle, parse_model_config
from sie.gateway.config_sync import (
    ConfigEpoch,
    ConfigState,
    DeltaOutcome,
    DeltaSubscriber,
    ModelSource,
    is_trusted_producer,
)
from sie.wire.config import ConfigNotification

ADAPTER = "sie.adapters.dense:DenseAdapter"


def model_data(sie_id: str, **profiles: dict[str, Any]) -> dict[str, Any]:
    return {
        "sie_id": sie_id,
        "hf_id": sie_id,
        "profiles": profiles or {"default": {"adapter_path": ADAPTER, "max_batch_tokens": 512}},
    }


def note(body: dict[str, Any] | str | None, epoch: int, producer: str = "sie-config") -> ConfigNotification:
    text = body if isinstance(body, str) else (dump_yaml(body) if body else "")
    return ConfigNotification(
        router_id=producer, bundle_id="default", epoch=epoch, bundle_config_hash="h", model_id="org/m",
        model_config=text,
    )  # fmt: skip


@pytest.fixture()
def state() -> ConfigState:
    bundle = parse_bundle({"name": "default", "priority": 10, "adapters": ["sie.adapters.dense"]})
    return ConfigState(Catalog([bundle], [parse_model_config(model_data("seed/m"))]))


@pytest.fixture()
def deltas(state: ConfigState) -> DeltaSubscriber:
    return DeltaSubscriber(None, state, ("sie-config",))  # type: ignore[arg-type]  # handle() never uses the bus


# --- ConfigEpoch ------------------------------------------------------------------------------------------


def test_set_max_never_moves_back_and_force_set_does() -> None:
    epoch = ConfigEpoch()
    assert epoch.set_max(5) is True
    assert epoch.set_max(3) is False
    assert epoch.set_max(5) is False
    assert epoch.get() == 5
    epoch.force_set(2)
    assert epoch.get() == 2


# --- producer trust ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("producer", "trusted"),
    [
        ("sie-config", True),
        ("sie-config-5f7b6d8c-kxwvr", True),
        ("sie-config-0", True),
        ("sie-configuration", False),
        ("sie-config-", False),
        ("sie-config-UPPER", False),
        ("evil", False),
        ("", False),
    ],
)
def test_producer_allowlist_exact_or_pod_prefix(producer: str, trusted: bool) -> None:
    assert is_trusted_producer(producer, ("sie-config",)) is trusted


def test_trust_any_and_empty_entries() -> None:
    assert is_trusted_producer("anyone", (), trust_any=True)
    assert not is_trusted_producer("anyone", ("",))
    assert is_trusted_producer("rel-config-0", ("sie-config", "rel-config"))


# --- deltas -----------------------------------------------------------------------------------------------


async def test_untrusted_delta_changes_nothing(state: ConfigState, deltas: DeltaSubscriber) -> None:
    outcome = await deltas.handle(note(model_data("org/new"), 4, producer="sie-configuration"))
    assert outcome is DeltaOutcome.UNTRUSTED
    assert state.epoch.get() == 0 and "org/new" not in state().models


async def test_trust_any_applies_any_producer(state: ConfigState) -> None:
    deltas = DeltaSubscriber(None, state, (), trust_any=True)  # type: ignore[arg-type]
    assert await deltas.handle(note(model_data("org/new"), 4, producer="laptop")) is DeltaOutcome.APPLIED


@pytest.mark.parametrize("body", [None, "   \n"])
async def test_empty_body_is_an_epoch_bump(state: ConfigState, deltas: DeltaSubscriber, body: str | None) -> None:
    assert await deltas.handle(note(body, 6)) is DeltaOutcome.EPOCH_ONLY
    assert state.epoch.get() == 6
    assert await deltas.handle(note(body, 2)) is DeltaOutcome.EPOCH_ONLY
    assert state.epoch.get() == 6


async def test_new_model_applies_and_advances_epoch(state: ConfigState, deltas: DeltaSubscriber) -> None:
    assert await deltas.handle(note(model_data("org/new"), 4)) is DeltaOutcome.APPLIED
    assert state.epoch.get() == 4
    assert state.source("org/new") is ModelSource.API
    assert state.source("seed/m") is ModelSource.FILESYSTEM
    assert state().get("org/new").model.sie_id == "org/new"


async def test_late_lower_epoch_delta_applies_without_moving_the_epoch_back(state, deltas) -> None:
    await deltas.handle(note(model_data("org/a"), 8))
    assert await deltas.handle(note(model_data("org/b"), 5)) is DeltaOutcome.APPLIED
    assert state.epoch.get() == 8
    assert {"org/a", "org/b"} <= set(state().models)


@pytest.mark.parametrize(
    "body",
    [
        "sie_id: [unclosed",  # bad YAML
        "- a list",  # not a mapping
        {"sie_id": "org/m", "profiles": {"default": {"adapter_path": ADAPTER}}},  # invalid config
        model_data("org/m", default={"adapter_path": "other.pkg:Adapter", "max_batch_tokens": 8}),  # unroutable
        model_data("seed/m", default={"adapter_path": ADAPTER, "max_batch_tokens": 999}),  # changed profile
        {**model_data("seed/m"), "hf_id": "other/repo"},  # changed top-level field
        {**model_data("seed/m"), "pool": "gpu-a"},  # moved pool
    ],
)
async def test_rejected_deltas_do_not_advance_the_epoch(state: ConfigState, deltas: DeltaSubscriber, body) -> None:
    before = state.snapshot
    assert await deltas.handle(note(body, 4)) is DeltaOutcome.REJECTED
    assert state.epoch.get() == 0
    assert state.snapshot is before


async def test_append_only_merge_adds_a_profile_and_keeps_the_source(state, deltas) -> None:
    merged = model_data(
        "seed/m",
        default={"adapter_path": ADAPTER, "max_batch_tokens": 512},
        fast={"extends": "default", "max_batch_tokens": 64},
    )
    assert await deltas.handle(note(merged, 2)) is DeltaOutcome.APPLIED
    assert sorted(state().models["seed/m"].profiles) == ["default", "fast"]
    assert state().find("seed/m:fast") is not None
    assert state.source("seed/m") is ModelSource.FILESYSTEM


async def test_readers_keep_their_snapshot_across_a_swap(state: ConfigState, deltas: DeltaSubscriber) -> None:
    held = state()
    await deltas.handle(note(model_data("org/new"), 1))
    assert "org/new" not in held.models
    assert "org/new" in state().models


# --- telemetry --------------------------------------------------------------------------------------------


async def test_deltas_are_recorded_and_the_applied_epoch_follows_set_max(
    state: ConfigState, deltas: DeltaSubscriber
) -> None:
    await deltas.handle(note(model_data("org/m"), epoch=1, producer="evil"))
    await deltas.handle(note(None, epoch=4))
    await deltas.handle(note(model_data("org/m"), epoch=6))
    await deltas.handle(note("sie_id: [unclosed", epoch=9))
    text = state.telemetry.prometheus_text().decode()
    for outcome, count in (("untrusted", 1), ("success", 2), ("rejected", 1)):
        assert f'sie_gateway_config_operations_total{{operation="delta",outcome="{outcome}"}} {count}.0' in text
    assert "sie_gateway_config_applied_epoch 6.0" in text
