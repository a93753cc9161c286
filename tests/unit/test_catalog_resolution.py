"""Model → bundle resolution, variants and profile merging (seed 000 §16.1, contracts Part B §3.2–3.5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sie.catalog import BundleConflictError, Catalog, ModelNotFoundError, load_yaml, parse_bundle, parse_model_config
from sie.catalog.adapters import ADAPTER_KINDS
from sie.catalog.ids import parse_model_spec
from sie.catalog.model import merge_adapter_options

BUNDLES = [
    parse_bundle({"name": "default", "priority": 10, "adapters": ["st.dense", "st.cross"]}),
    parse_bundle({"name": "fast", "priority": 5, "adapters": ["st.cross"]}),
    parse_bundle({"name": "candle", "priority": 30, "adapters": ["rust.candle"], "engine": "candle"}),
]


def _model(sie_id: str, **profiles) -> object:
    return parse_model_config({"sie_id": sie_id, "hf_id": sie_id, "profiles": profiles})


MODELS = [
    _model(
        "BAAI/bge-m3",
        default={
            "adapter_path": "st.dense:D",
            "max_batch_tokens": 16384,
            "adapter_options": {"runtime": {"pooling": "cls"}},
        },
        candle={"extends": "default", "adapter_path": "rust.candle:C"},
    ),
    _model("org/reranker", default={"adapter_path": "st.cross:X", "max_batch_tokens": 4096}),
    _model("org/candle-only", candle={"adapter_path": "rust.candle:C", "max_batch_tokens": 1}),
]


@pytest.fixture()
def catalog() -> Catalog:
    return Catalog(BUNDLES, MODELS)


def test_lowest_priority_compatible_bundle_wins(catalog: Catalog) -> None:
    resolution = catalog.resolve("org/reranker")
    assert resolution.bundle.name == "fast"
    assert resolution.compatible_bundles == ("fast", "default")


def test_lookup_is_case_insensitive(catalog: Catalog) -> None:
    assert catalog.resolve("baai/BGE-M3").entry.model_id == "BAAI/bge-m3"


def test_variant_routes_by_its_own_profile(catalog: Catalog) -> None:
    resolution = catalog.resolve("BAAI/bge-m3:candle")
    assert (resolution.entry.profile, resolution.bundle.name) == ("candle", "candle")
    assert resolution.entry.is_variant


def test_model_without_default_profile_is_served_only_as_variant(catalog: Catalog) -> None:
    with pytest.raises(ModelNotFoundError):
        catalog.resolve("org/candle-only")
    assert catalog.resolve("org/candle-only:candle").bundle.name == "candle"


def test_bundle_override(catalog: Catalog) -> None:
    assert catalog.resolve("DEFAULT:/org/reranker").bundle.name == "default"
    assert catalog.resolve("org/reranker", bundle="default").bundle.name == "default"


def test_incompatible_override_conflicts(catalog: Catalog) -> None:
    with pytest.raises(BundleConflictError) as info:
        catalog.resolve("candle:/org/reranker")
    assert info.value.compatible_bundles == ["fast", "default"]


def test_unknown_model(catalog: Catalog) -> None:
    with pytest.raises(ModelNotFoundError, match="Model 'acme/missing' not found"):
        catalog.resolve("acme/missing")


def test_a_model_no_bundle_runs_is_refused_saying_why() -> None:
    gliformer = _model(
        "knowledgator/gliformer-base-v1",
        default={"adapter_path": "sie_server.adapters.gliformer.adapter:G", "max_batch_tokens": 1},
    )
    other = _model("acme/odd", default={"adapter_path": "acme.adapters.odd:O", "max_batch_tokens": 1})
    catalog = Catalog(BUNDLES, [gliformer, other])
    with pytest.raises(ModelNotFoundError, match="no routable bundle: its adapter .* is GLiFormer multi-task"):
        catalog.resolve("knowledgator/gliformer-base-v1")
    with pytest.raises(ModelNotFoundError, match="no bundle runs its adapter module 'acme.adapters.odd'"):
        catalog.resolve("acme/odd")


def test_affected_bundles_cover_every_profile(catalog: Catalog) -> None:
    names = [b.name for b in catalog.model_bundles(catalog.models["BAAI/bge-m3"])]
    assert names == ["default", "candle"]


def test_extends_merges_scalars_and_option_groups(catalog: Catalog) -> None:
    resolved = catalog.models["BAAI/bge-m3"].resolve_profile("candle")
    assert resolved.adapter_path == "rust.candle:C"
    assert resolved.max_batch_tokens == 16384
    assert resolved.adapter_options == {"runtime": {"pooling": "cls"}}


def test_non_empty_child_group_replaces_parent_group() -> None:
    parent = {"loadtime": {"a": 1}, "runtime": {"pooling": "mean", "normalize": True}}
    child = {"runtime": {"pooling": "cls"}, "loadtime": {}}
    assert merge_adapter_options(parent, child) == {"loadtime": {"a": 1}, "runtime": {"pooling": "cls"}}


def test_spec_parsing() -> None:
    assert parse_model_spec("org/model:v") == parse_model_spec("org/model:v")
    spec = parse_model_spec("Candle:/org/model:candle")
    assert (spec.bundle, spec.model_id) == ("candle", "org/model:candle")
    assert parse_model_spec("org/model").bundle is None


def test_with_models_builds_a_new_snapshot(catalog: Catalog) -> None:
    added = catalog.with_models([_model("org/new", default={"adapter_path": "st.dense:D", "max_batch_tokens": 1})])
    assert "org/new" in added.models and "org/new" not in catalog.models
    assert added.bundle_config_hash("default") != catalog.bundle_config_hash("default")


def test_the_default_bundle_runs_exactly_the_modules_an_adapter_kind_serves() -> None:
    """`config/bundles/default.yaml` (what routes to a worker) and `sie.catalog.adapters` (what kind serves it) list
    the same modules: a module in one list only would route and fail, or serve and never route."""
    bundle = Path(__file__).resolve().parents[2] / "config" / "bundles" / "default.yaml"
    assert set(load_yaml(bundle.read_text())["adapters"]) == set(ADAPTER_KINDS)
