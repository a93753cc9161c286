"""Read-side answers of the config service built from one RegistryState (contracts Part A §2.4): model and
bundle lists, single YAML documents, resolution, the epoch fingerprints and the export snapshot. Pure.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from sie.catalog import Catalog, ModelConfig, dump_yaml, validate_model_id
from sie.catalog.catalog import bundle_adapters
from sie.control.errors import UnknownBundleError, UnknownModelError
from sie.control.registry import SOURCE_FILESYSTEM, RegistryState

SNAPSHOT_VERSION: Final = 1


def list_models(state: RegistryState) -> dict[str, Any]:
    """Every base model with all its profiles, plus one `model:profile` entry per non-default profile."""
    rows = []
    for entry in state.catalog.entries.values():
        profiles = [entry.profile] if entry.is_variant else sorted(entry.model.profiles)
        rows.append({"model_id": entry.model_id, "profiles": profiles, "source": state.source(entry.model.sie_id)})
    listed = {row["model_id"] for row in rows}
    for model in state.catalog.models.values():  # models without a `default` profile have no base entry
        if model.sie_id not in listed:
            rows.append(
                {"model_id": model.sie_id, "profiles": sorted(model.profiles), "source": state.source(model.sie_id)}
            )
    return {"models": sorted(rows, key=lambda row: row["model_id"])}


def model_yaml(state: RegistryState, model_id: str) -> str:
    """The stored or filesystem YAML of a model; for a `model:profile` variant a minimal YAML; else 404."""
    validate_model_id(model_id)
    model = state.find_model(model_id)
    if model is not None:
        return state.yaml_texts.get(model.sie_id) or dump_yaml(dict(model.raw))
    entry = state.catalog.find(model_id)
    if entry is None:
        raise UnknownModelError(model_id)
    bundles = [bundle.name for bundle in state.catalog.entry_bundles(entry)]
    return dump_yaml({"sie_id": entry.model_id, "source": state.source(entry.model.sie_id), "bundles": bundles})


def list_bundles(catalog: Catalog) -> dict[str, Any]:
    rows = [
        {
            "bundle_id": bundle.name,
            "engine": bundle.engine,
            "priority": bundle.priority,
            "adapter_count": len(bundle.adapters),
            "source": SOURCE_FILESYSTEM,
        }
        for bundle in catalog.bundles_by_priority
    ]
    return {"bundles": rows}


def bundle_yaml(catalog: Catalog, bundle_id: str) -> str:
    bundle = catalog.bundles.get(bundle_id)
    if bundle is None:
        raise UnknownBundleError(bundle_id)
    return dump_yaml(
        {
            "adapters": list(bundle.adapters),
            "engine": bundle.engine,
            "name": bundle.name,
            "priority": bundle.priority,
            "source": SOURCE_FILESYSTEM,
        }
    )


def resolve(catalog: Catalog, spec: str, bundle: str | None) -> dict[str, Any]:
    """Where `[bundle:/]org/model[:variant]` routes; 404 model_not_found, 409 bundle_conflict."""
    resolution = catalog.resolve(spec, bundle)
    entry = resolution.entry
    profiles = [entry.profile] if entry.is_variant else sorted(entry.model.profiles)
    return {
        "model": entry.model_id,
        "resolved_bundle": resolution.bundle.name,
        "compatible_bundles": list(resolution.compatible_bundles),
        "profiles": profiles,
    }


def epoch_view(epoch: int, state: RegistryState | None) -> dict[str, Any]:
    """The epoch and compact fingerprints; the hashes are `""` while the registry is unavailable."""
    if state is None:
        return {"epoch": epoch, "bundles_hash": "", "bundle_config_hashes_hash": ""}
    catalog = state.catalog
    return {
        "epoch": epoch,
        "bundles_hash": catalog.bundles_hash,
        "bundle_config_hashes_hash": catalog.bundle_config_hashes_hash,
    }


def model_bundle_names(catalog: Catalog, model: ModelConfig) -> list[str]:
    return [bundle.name for bundle in catalog.model_bundles(model)]


def _export_row(state: RegistryState, model: ModelConfig) -> dict[str, Any]:
    return {
        "model_id": model.sie_id,
        "model_config": dict(model.raw),
        "raw_yaml": state.yaml_texts.get(model.sie_id) or dump_yaml(dict(model.raw)),
        "affected_bundles": model_bundle_names(state.catalog, model),
        "pool": model.effective_pool,
        "source": state.source(model.sie_id),
    }


def export_snapshot(state: RegistryState, epoch: int, now: datetime) -> dict[str, Any]:
    """The full snapshot gateways and workers rebuild from (seed 000 §4.1); `now` must be timezone-aware UTC."""
    catalog = state.catalog
    return {
        "snapshot_version": SNAPSHOT_VERSION,
        "epoch": epoch,
        "generated_at": now.isoformat(),
        "bundle_config_hashes": dict(catalog.bundle_config_hashes),
        "bundle_pool_config_hashes": catalog.bundle_pool_config_hashes,
        "bundle_adapters": bundle_adapters(catalog.bundles),
        "models": [_export_row(state, catalog.models[key]) for key in sorted(catalog.models)],
    }
