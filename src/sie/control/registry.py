"""The config service's authoritative in-memory state: bundles (read once from disk) and models (filesystem
baseline plus API writes), held as one immutable RegistryState that writers replace whole (seed 000 §3.3.4).

Readers take `registry.state` once per request and never see a half-applied write. Nothing here does I/O
or knows about HTTP; the write path lives in `writes.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from sie.catalog import Catalog, ModelConfig, dump_yaml
from sie.control.errors import RegistryUnavailableError

SOURCE_FILESYSTEM: Final = "filesystem"
SOURCE_API: Final = "api"


@attrs.frozen
class RegistryState:
    """One consistent view: the catalog, where each model came from, its YAML text and the filesystem baseline."""

    catalog: Catalog
    sources: Mapping[str, str] = attrs.field(factory=dict)
    yaml_texts: Mapping[str, str] = attrs.field(factory=dict)
    baseline: Mapping[str, ModelConfig] = attrs.field(factory=dict)

    @classmethod
    def from_filesystem(cls, catalog: Catalog) -> RegistryState:
        """The start-up state: every loaded model is a filesystem model (its YAML re-dumped from `raw`)."""
        models = dict(catalog.models)
        return cls(
            catalog=catalog,
            sources={model_id: SOURCE_FILESYSTEM for model_id in models},
            yaml_texts={model_id: dump_yaml(dict(model.raw)) for model_id, model in models.items()},
            baseline=models,
        )

    def find_model(self, model_id: str) -> ModelConfig | None:
        """A base model by id, exactly first, then case-insensitively."""
        model = self.catalog.models.get(model_id)
        if model is not None:
            return model
        folded = model_id.casefold()
        return next((m for key, m in self.catalog.models.items() if key.casefold() == folded), None)

    def source(self, model_id: str) -> str:
        return self.sources.get(model_id, SOURCE_FILESYSTEM)

    def with_api_model(self, model: ModelConfig, yaml_text: str) -> RegistryState:
        """A new state with `model` added or replaced, marked as written through the API."""
        return attrs.evolve(
            self,
            catalog=self.catalog.with_models([model]),
            sources={**self.sources, model.sie_id: SOURCE_API},
            yaml_texts={**self.yaml_texts, model.sie_id: yaml_text},
        )

    def without_api_model(self, model_id: str) -> RegistryState:
        """A new state with the API copy of `model_id` gone; its filesystem baseline, if any, comes back."""
        fallback = self.baseline.get(model_id)
        models = {key: value for key, value in self.catalog.models.items() if key != model_id}
        sources = {key: value for key, value in self.sources.items() if key != model_id}
        texts = {key: value for key, value in self.yaml_texts.items() if key != model_id}
        if fallback is not None:
            models[model_id] = fallback
            sources[model_id] = SOURCE_FILESYSTEM
            texts[model_id] = dump_yaml(dict(fallback.raw))
        catalog = Catalog(self.catalog.bundles.values(), models.values())
        return attrs.evolve(self, catalog=catalog, sources=sources, yaml_texts=texts)


class ModelRegistry:
    """Holds the current RegistryState; `swap` replaces it in one assignment (readers need no lock)."""

    def __init__(self, state: RegistryState | None, load_error: str | None = None) -> None:
        self._state = state
        self.load_error = load_error

    @classmethod
    def unavailable(cls, reason: str) -> ModelRegistry:
        """A registry whose bundles failed to load: every registry read answers registry_unavailable."""
        return cls(None, reason)

    @property
    def available(self) -> bool:
        return self._state is not None

    @property
    def state(self) -> RegistryState:
        """The current state; RegistryUnavailableError when start-up failed to load the bundles."""
        if self._state is None:
            raise RegistryUnavailableError(f"Model registry is unavailable: {self.load_error}")
        return self._state

    def swap(self, state: RegistryState) -> None:
        self._state = state
