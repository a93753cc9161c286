"""Real models for integration tests: the baseline catalogue loaded from its offline PyPI wheels.

Artifacts go to the repository's `.cache/models` (shared across runs, as `make test` pre-fills it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sie.catalog import Catalog, load_catalog
from sie.worker.artifacts import ArtifactResolver
from sie.worker.loading import LoadedModel, ModelLoader
from sie.worker.session import SessionOptions

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def baseline_catalog() -> Catalog:
    return load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")


@pytest.fixture(scope="session")
def model_loader() -> ModelLoader:
    cache = REPO / ".cache" / "models"
    resolver = ArtifactResolver(cache, hf_offline=True, wheel_dir=REPO / ".cache" / "wheels")
    return ModelLoader(resolver, cache / "converted", SessionOptions(intra_op_threads=1))


@pytest.fixture(scope="session")
def load_model(baseline_catalog: Catalog, model_loader: ModelLoader):
    """Load a baseline model id (variants included) once per test session."""
    loaded: dict[str, LoadedModel] = {}

    def load(model_id: str) -> LoadedModel:
        if model_id not in loaded:
            entry = baseline_catalog.get(model_id)
            loaded[model_id] = model_loader.load(entry.model, entry.profile, entry.model_id)
        return loaded[model_id]

    return load
