"""The gateway's config registry (seed 000 §4, §5): the current Catalog with each model's source, the local
ConfigEpoch and the two stored control-plane fingerprints.

Readers take `state()` lock-free: every write builds a new immutable snapshot and swaps it in with one
assignment, so a reader never sees bundles from one write and models from another. Writers (bootstrap,
poller recovery, deltas) hold `write_lock` across read → build → swap so no write is lost.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Iterable, Mapping

import attrs

from sie.catalog import Bundle, Catalog, ConfigError, ModelConfig
from sie.telemetry.metrics import Telemetry


class ModelSource(enum.StrEnum):
    """Where the gateway learned a model: the filesystem seed or the config service."""

    FILESYSTEM = "filesystem"
    API = "api"


class ConfigEpoch:
    """The local, monotonic count of model writes seen (seed 000 §4.3): `set_max` never moves it back.

    One event loop owns it, so a plain compare-and-assign is the CAS loop of the seed. `on_change` (the
    sie.gateway.config.applied_epoch gauge) hears every value it moves to.
    """

    def __init__(self, value: int = 0, on_change: Callable[[int], None] | None = None) -> None:
        self._value = value
        self._on_change = on_change
        self._publish()

    def _publish(self) -> None:
        if self._on_change is not None:
            self._on_change(self._value)

    def get(self) -> int:
        return self._value

    def set_max(self, value: int) -> bool:
        """Advance to `value` if it is higher; True when the epoch moved."""
        if value > self._value:
            self._value = value
            self._publish()
            return True
        return False

    def force_set(self, value: int) -> None:
        """Move to `value` even backwards: only rewind recovery after a successful export calls this (§4.2)."""
        self._value = value
        self._publish()


@attrs.frozen
class Snapshot:
    """One consistent registry view: the catalog and the source of each of its models."""

    catalog: Catalog
    sources: Mapping[str, ModelSource]


class DeltaRejectedError(Exception):
    """A live delta that cannot be merged: an append-only conflict, or a model no bundle can route."""


class ConfigState:
    """The registry the gateway app reads through `state()` (a CatalogSource) and the sync tasks write.

    `telemetry` is the process's facade (the role passes its own; a fresh one otherwise): the sync tasks record
    through it, and the epoch and degraded flag publish their gauges on every change.
    """

    def __init__(
        self, catalog: Catalog, source: ModelSource = ModelSource.FILESYSTEM, telemetry: Telemetry | None = None
    ) -> None:
        self._snapshot = Snapshot(catalog, {model_id: source for model_id in catalog.models})
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        self.epoch = ConfigEpoch(on_change=self.telemetry.set_applied_epoch)
        self.bundles_hash = ""
        self.bundle_config_hashes_hash = ""
        self._degraded = False
        self.telemetry.set_bootstrap_degraded(False)
        self.write_lock = asyncio.Lock()

    @property
    def degraded(self) -> bool:
        """sie.gateway.config.bootstrap.degraded: set after sustained bootstrap failure, cleared on success."""
        return self._degraded

    @degraded.setter
    def degraded(self, value: bool) -> None:
        self._degraded = value
        self.telemetry.set_bootstrap_degraded(value)

    def __call__(self) -> Catalog:
        return self._snapshot.catalog

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    @property
    def catalog(self) -> Catalog:
        return self._snapshot.catalog

    def source(self, model_id: str) -> ModelSource:
        return self._snapshot.sources.get(model_id, ModelSource.API)

    def store_hashes(self, bundles_hash: str, bundle_config_hashes_hash: str) -> None:
        self.bundles_hash = bundles_hash
        self.bundle_config_hashes_hash = bundle_config_hashes_hash

    # Writers: call with `write_lock` held.

    def install_bundles(self, bundles: Iterable[Bundle]) -> None:
        """Replace the bundle set; model → bundle associations follow from the new catalog."""
        snapshot = self._snapshot
        self._snapshot = Snapshot(snapshot.catalog.with_bundles(bundles), snapshot.sources)

    def replace_models(self, models: Mapping[str, tuple[ModelConfig, ModelSource]]) -> None:
        """Replace the whole model set (an authoritative export), removals included."""
        catalog = Catalog(self.catalog.bundles.values(), (model for model, _ in models.values()))
        self._snapshot = Snapshot(catalog, {model_id: source for model_id, (_, source) in models.items()})

    def add_model_config(self, model: ModelConfig) -> None:
        """Merge one delta append-only (seed 000 §3): new profiles join, existing ones must be unchanged."""
        current = self.catalog.models.get(model.sie_id)
        if current is not None:
            _check_append_only(current, model)
        catalog = self.catalog.with_models([model])
        _check_routable(catalog, model)
        sources = {**self._snapshot.sources, model.sie_id: ModelSource.API}
        if current is not None:
            sources[model.sie_id] = self.source(model.sie_id)
        self._snapshot = Snapshot(catalog, sources)


_IDENTITY_FIELDS = ("hf_id", "hf_revision", "weights_path", "package", "package_backed", "effective_pool")


def _check_append_only(current: ModelConfig, incoming: ModelConfig) -> None:
    changed = [name for name in _IDENTITY_FIELDS if getattr(current, name) != getattr(incoming, name)]
    if changed:
        raise DeltaRejectedError(f"model '{current.sie_id}': top-level fields changed: {changed}")
    for name, profile in current.profiles.items():
        if incoming.profiles.get(name) != profile:
            raise DeltaRejectedError(f"model '{current.sie_id}': existing profile '{name}' changed or removed")


def _check_routable(catalog: Catalog, model: ModelConfig) -> None:
    for name in model.profiles:
        try:
            module = model.resolve_profile(name).adapter_module
        except ConfigError as exc:
            raise DeltaRejectedError(str(exc)) from exc
        if not any(bundle.runs(module) for bundle in catalog.bundles.values()):
            raise DeltaRejectedError(f"model '{model.sie_id}': adapter of profile '{name}' is in no known bundle")
