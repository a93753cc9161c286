"""The Catalog: an immutable snapshot of bundles and models with model → bundle resolution and hashes.

Resolution follows seed 000 §16.1: the requested profile's adapter module picks the compatible
bundles, lowest priority first. Every non-default profile P of model M is also served as the
variant `M:P`. Lookups are case-insensitive. Writers build a new Catalog and swap it in whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cached_property

import attrs

from sie.catalog import hashing
from sie.catalog.adapters import unserved_reason
from sie.catalog.bundle import Bundle
from sie.catalog.errors import BundleConflictError, ConfigError, ModelNotFoundError
from sie.catalog.ids import parse_model_spec
from sie.catalog.model import DEFAULT_PROFILE, ModelConfig


@attrs.frozen
class ModelEntry:
    """A servable id: a base model (profile `default`) or a variant `M:P` (profile P of M)."""

    model_id: str
    model: ModelConfig
    profile: str

    @property
    def is_variant(self) -> bool:
        return self.model_id != self.model.sie_id


@attrs.frozen
class Resolution:
    """Where a request for a model spec goes: the entry, the chosen bundle and its alternatives."""

    entry: ModelEntry
    bundle: Bundle
    compatible_bundles: tuple[str, ...]


class Catalog:
    """Bundles and models, read-only once built; derived indexes are computed lazily and cached.

    `problems` are the model files (or profiles) left out of a catalogue read from disk, each with its reason: what a
    server lists as not servable instead of refusing to start over one bad file.
    """

    def __init__(
        self,
        bundles: Iterable[Bundle] = (),
        models: Iterable[ModelConfig] = (),
        problems: Iterable[ConfigError] = (),
    ) -> None:
        self.bundles: dict[str, Bundle] = {bundle.name: bundle for bundle in bundles}
        self.models: dict[str, ModelConfig] = {model.sie_id: model for model in models}
        self.problems: tuple[ConfigError, ...] = tuple(problems)

    def with_models(self, models: Iterable[ModelConfig]) -> Catalog:
        """A new catalog with these models added or replaced (a replaced model's problems go with it)."""
        added = {model.sie_id: model for model in models}
        problems = (problem for problem in self.problems if problem.model_id not in added)
        return Catalog(self.bundles.values(), {**self.models, **added}.values(), problems)

    def with_bundles(self, bundles: Iterable[Bundle]) -> Catalog:
        """A new catalog with the bundle set replaced and the same models."""
        return Catalog(bundles, self.models.values(), self.problems)

    @cached_property
    def bundles_by_priority(self) -> list[Bundle]:
        return sorted(self.bundles.values(), key=lambda b: (b.priority, b.name))

    @cached_property
    def entries(self) -> dict[str, ModelEntry]:
        """Every servable id: base models (those with a `default` profile), then non-colliding variants."""
        entries = {
            sie_id: ModelEntry(sie_id, model, DEFAULT_PROFILE)
            for sie_id, model in self.models.items()
            if DEFAULT_PROFILE in model.profiles
        }
        for model in self.models.values():
            for profile in model.profiles:
                variant = f"{model.sie_id}:{profile}"
                if profile != DEFAULT_PROFILE and variant not in entries:
                    entries[variant] = ModelEntry(variant, model, profile)
        return entries

    @cached_property
    def _entries_folded(self) -> dict[str, ModelEntry]:
        return {model_id.casefold(): entry for model_id, entry in self.entries.items()}

    def find(self, model_id: str) -> ModelEntry | None:
        """The entry for an id, matched exactly first, then case-insensitively."""
        return self.entries.get(model_id) or self._entries_folded.get(model_id.casefold())

    def get(self, model_id: str) -> ModelEntry:
        entry = self.find(model_id)
        if entry is None:
            raise ModelNotFoundError(model_id)
        return entry

    def entry_bundles(self, entry: ModelEntry) -> list[Bundle]:
        """Bundles that run the entry's profile, lowest priority first."""
        try:
            module = entry.model.resolve_profile(entry.profile).adapter_module
        except ConfigError:
            return []
        return [bundle for bundle in self.bundles_by_priority if bundle.runs(module)]

    def model_bundles(self, model: ModelConfig) -> list[Bundle]:
        """Bundles that run any profile of the model: the bundles a change to it affects."""
        modules = model.adapter_modules()
        return [b for b in self.bundles_by_priority if any(b.runs(module) for module in modules)]

    def resolve(self, spec: str, bundle: str | None = None) -> Resolution:
        """Resolve `[bundle:/]org/model[:variant]` (or an explicit bundle) to an entry and a bundle."""
        parsed = parse_model_spec(spec)
        entry = self.get(parsed.model_id)
        compatible = self.entry_bundles(entry)
        if not compatible:
            try:
                why = unserved_reason(entry.model.resolve_profile(entry.profile).adapter_path)
            except ConfigError as exc:
                why = exc.describe()
            raise ModelNotFoundError(entry.model_id, f"Model '{entry.model_id}' has no routable bundle: {why}")
        names = tuple(b.name for b in compatible)
        override = (bundle or parsed.bundle or "").strip().lower()
        if not override:
            return Resolution(entry, compatible[0], names)
        for candidate in compatible:
            if candidate.name.lower() == override:
                return Resolution(entry, candidate, names)
        raise BundleConflictError(entry.model_id, override, names)

    def unroutable_models(self) -> list[str]:
        """Models none of whose profiles runs on any bundle."""
        return sorted(m.sie_id for m in self.models.values() if not self.model_bundles(m))

    def bundle_config_hash(self, bundle: str, pool: str | None = None) -> str:
        return hashing.bundle_config_hash(self.bundles[bundle], self.models.values(), pool)

    @cached_property
    def bundle_config_hashes(self) -> dict[str, str]:
        """`{bundle: hash}` over every model regardless of pool (`""` for a bundle that runs nothing)."""
        return {name: self.bundle_config_hash(name) for name in sorted(self.bundles)}

    @cached_property
    def bundle_pool_config_hashes(self) -> dict[str, dict[str, str]]:
        """`{bundle: {pool: hash}}`, empty hashes left out."""
        pools = sorted({model.effective_pool for model in self.models.values()})
        result: dict[str, dict[str, str]] = {}
        for name in sorted(self.bundles):
            by_pool = {pool: self.bundle_config_hash(name, pool) for pool in pools}
            by_pool = {pool: digest for pool, digest in by_pool.items() if digest}
            if by_pool:
                result[name] = by_pool
        return result

    @cached_property
    def bundles_hash(self) -> str:
        return hashing.bundles_hash(self.bundles.values())

    def model_pools_by_bundle(self) -> dict[str, dict[str, str]]:
        """`{bundle: {model_id: pool}}` for every model the bundle serves."""
        result: dict[str, dict[str, str]] = {name: {} for name in self.bundles}
        for model in self.models.values():
            for bundle in self.model_bundles(model):
                result[bundle.name][model.sie_id] = model.effective_pool
        return result

    @cached_property
    def bundle_config_hashes_hash(self) -> str:
        return hashing.bundle_config_hashes_hash(self.bundle_config_hashes, self.model_pools_by_bundle())


def bundle_adapters(bundles: Mapping[str, Bundle]) -> dict[str, list[str]]:
    """`{bundle: [modules]}` as the export and the config deltas carry it."""
    return {name: list(bundle.adapters) for name, bundle in sorted(bundles.items())}
